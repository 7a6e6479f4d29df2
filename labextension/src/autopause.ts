/**
 * What the auto-pause announcement shows for a `GET policy` answer. No JupyterLab imports, so
 * it is unit-tested in Node.
 */

import type { IPolicy } from './api';
import { formatClock, formatIdleTime, formatTime, ITrans } from './format';

/** What the auto-pause announcement shows; null when nothing is announced. */
export interface IAutoPauseView {
  /** Identifies one announcement (its deadline): a new one gets a new notification. */
  key: string;
  /** When the pause happens, on the browser's clock (ms since the epoch). */
  at: number;
  message: string;
}

/**
 * The announcement of an auto-pause, for `policy` read at `readAt` (ms since the epoch, the
 * browser's clock). The time of the pause is the read time plus the server's `seconds_left`,
 * so clock skew between browser and server does not matter. It names a clock time rather than
 * counting down: the notification's text never changes once shown (see `autopausenotice.ts`).
 * Seconds are shown only when the pause is less than two minutes away. Null unless an
 * auto-pause is announced and can still be cancelled.
 */
export function describeAutoPause(
  policy: IPolicy | null,
  readAt: number,
  trans: ITrans
): IAutoPauseView | null {
  if (
    !policy ||
    !policy.enabled ||
    policy.state !== 'announced' ||
    !policy.cancellable
  ) {
    return null;
  }
  const left = Math.max(0, policy.seconds_left ?? 0);
  const at = readAt + left * 1000;
  const iso = new Date(at).toISOString();
  const clock = left < 120 ? formatTime(iso) : formatClock(iso);
  const profile = policy.profile?.name ?? '?';
  const idle = formatIdleTime(policy.profile?.idle_after);
  const message =
    policy.profile?.action === 'stop'
      ? trans.__(
          'This workspace will stop its kernels at %1 because it has been idle for %2 (profile %3).',
          clock,
          idle,
          profile
        )
      : trans.__(
          'This workspace will pause at %1 because it has been idle for %2 (profile %3).',
          clock,
          idle,
          profile
        );
  return {
    key: policy.deadline ?? `${profile}:${Math.round(at / 1000)}`,
    at,
    message
  };
}

/**
 * What the auto-pause announcement shows for a `GET policy` answer. No JupyterLab imports, so
 * it is unit-tested in Node.
 */

import type { IPolicy } from './api';
import { formatCountdown, formatIdleTime, ITrans } from './format';

/** What the auto-pause announcement shows; null when nothing is announced. */
export interface IAutoPauseView {
  /** Identifies one announcement (its deadline): a new one gets a new notification. */
  key: string;
  secondsLeft: number;
  message: string;
}

/**
 * The announcement of an auto-pause, `elapsed` seconds after `policy` was read (the countdown
 * runs on the browser's clock from the server's `seconds_left`, so clock skew does not
 * matter). Null unless an auto-pause is announced and can still be cancelled.
 */
export function describeAutoPause(
  policy: IPolicy | null,
  elapsed: number,
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
  const left = Math.max(0, (policy.seconds_left ?? 0) - Math.max(0, elapsed));
  const countdown = formatCountdown(left);
  const profile = policy.profile?.name ?? '?';
  const idle = formatIdleTime(policy.profile?.idle_after);
  const message =
    policy.profile?.action === 'stop'
      ? trans.__(
          'This workspace will stop its kernels in %1 because it has been idle for %2 (profile %3).',
          countdown,
          idle,
          profile
        )
      : trans.__(
          'This workspace will pause in %1 because it has been idle for %2 (profile %3).',
          countdown,
          idle,
          profile
        );
  return {
    key: policy.deadline ?? `${profile}:${policy.seconds_left}`,
    secondsLeft: left,
    message
  };
}

/**
 * The jupyter_pause REST API (`<base_url>/jupyter-pause/api/...`): the shapes of its answers
 * and a client for the calls this extension makes.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type { IOffer } from './offers';
import type { FlightKind, Outcome, WorkspaceState } from './vocabulary';

// The lifecycle's names (states, outcomes, flight kinds, events) are generated from the
// server's vocabulary: jupyter_pause/vocabulary.py.
export type {
  FailureReason,
  FlightKind,
  KernelOutcome,
  LifecycleEvent,
  Outcome,
  StepName,
  WorkspaceState
} from './vocabulary';

export interface IStep {
  name: string;
  done?: number | null;
  total?: number | null;
  message?: string | null;
  unit?: string | null;
}

export interface IFlight {
  id: string;
  kind: FlightKind;
  trigger?: string;
  started?: string;
}

export interface IBackendInfo {
  name: string;
  configured: boolean;
  can_pause: boolean;
  why_not?: string | null;
}

export interface IKernelInfo {
  id: string;
  name?: string;
  path?: string | null;
  execution_state?: string | null;
}

export interface ICheckpointSummary {
  id: string;
  created?: string | null;
  bytes_total?: number | null;
  kernels?: number | null;
}

export interface ICellProvenance {
  execution_count?: number | null;
  source?: string | null;
}

export interface IReportVariable {
  name: string;
  kind?: string | null;
  size?: number | null;
  status:
    | 'live'
    | 'restored'
    | 'skipped'
    | 'stale'
    | 'failed'
    | 'recomputed'
    | string;
  reason?: string | null;
  recomputable?: boolean;
  cell?: ICellProvenance | null;
}

export interface IKernelReport {
  path?: string | null;
  kernel_id?: string | null;
  outcome: Outcome | string;
  reason?: string | null;
  checkpoint_id?: string | null;
  variables?: IReportVariable[];
  /** Random generators, working directory, settings, IPython state: rows like variables'. */
  process_state?: IReportVariable[];
  /** Why the pause did not save this kernel's state (the person chose "Pause anyway"). */
  state_not_saved?: string | null;
}

export interface IReport {
  flight_id: string;
  outcome: Outcome | string;
  requested?: string | null;
  usable?: string | null;
  durations?: { [key: string]: number };
  kernels?: IKernelReport[];
}

export interface ITimelineEntry {
  event: string;
  at: string;
  [key: string]: unknown;
}

/** The checkpoints a resume restores; `offered` ones are the way back after a failed pause. */
export interface IResumeFrom {
  offered: boolean;
  checkpoints: {
    path?: string | null;
    checkpoint_id?: string | null;
    created?: string | null;
    age_s?: number | null;
  }[];
}

/** `GET status`. */
export interface IStatus {
  /** The newest lifecycle event this answer includes (events carry theirs). */
  seq?: number;
  state: WorkspaceState;
  outcome?: Outcome | null;
  step?: IStep | null;
  reason?: string | null;
  hint?: string | null;
  flight?: IFlight | null;
  timeline?: ITimelineEntry[];
  backend?: IBackendInfo | null;
  kernels?: IKernelInfo[];
  last_checkpoint?: ICheckpointSummary | null;
  last_report?: IReport | null;
  /** True when POST resume would work now (paused, or a failure that left a way back). */
  resume_available?: boolean;
  /** What a resume would restore; `offered` when it is an older checkpoint (a pause failed). */
  resume_from?: IResumeFrom | null;
  /** The accelerator this workspace holds (`{"type": "none", "count": 0}` without one). */
  accelerator?: { type?: string; count?: number } | null;
  /** Notebooks whose kernel died or was lost, and the saved state that can bring it back. */
  offers?: IOffer[];
}

/** One entry of `GET checkpoints`. */
export interface ICheckpointListing {
  id: string;
  /** The notebook's session name (its path, relative or absolute). */
  stream?: string | null;
  created?: string | null;
  bytes_total?: number | null;
  variables?: number | null;
}

/** `GET policy` (the idle policy's auto-pause state); only the fields the UI uses. */
export interface IPolicy {
  enabled: boolean;
  /** disabled | watching | announced | firing | inactive (a flight runs, or paused). */
  state: string;
  profile?: {
    name: string;
    action?: 'pause' | 'stop' | 'none' | string;
    idle_after?: number;
    grace_period?: number;
  } | null;
  deadline?: string | null;
  seconds_left?: number | null;
  cancellable?: boolean;
  last_decision?: { kind: string; reason: string } | null;
}

/** The calls the controller makes; an interface so tests can answer them in any order. */
export interface IPauseAPI {
  /** `GET status`. */
  status(): Promise<IStatus>;
  /** `GET policy`. */
  policy(): Promise<IPolicy>;
  /** `POST policy/cancel`: cancel an announced auto-pause. */
  cancelAutoPause(): Promise<IPolicy>;
  /**
   * `POST pause` or `POST resume` with `trigger: manual`; `loseState`: the ids of kernels that
   * cannot be checkpointed and may lose their state (the person chose "Pause anyway").
   */
  start(kind: 'pause' | 'resume', loseState?: string[]): Promise<IFlight>;
  /** `POST recompute`: re-run the recorded cells of skipped variables of one notebook. */
  recompute(path: string, names: string[]): Promise<IReportVariable[]>;
  /** `GET checkpoints`: what the store holds (for "Restore from Checkpoint"). */
  checkpoints?(): Promise<ICheckpointListing[]>;
  /** `POST offers/restore`: bring a dead kernel's saved state back into its new kernel. */
  restoreOffer?(
    path: string,
    id?: string
  ): Promise<{ variables?: IReportVariable[] }>;
  /** `POST offers/dismiss`: the person does not want it back. */
  dismissOffer?(path: string, id?: string): Promise<void>;
}

/** A kernel a pause cannot checkpoint (`POST pause`'s 409 `uncheckpointable`). */
export interface IUncheckpointable {
  kernel_id: string;
  path?: string | null;
  kernel?: string;
  language?: string;
  why?: string;
  install_command?: string | null;
}

/**
 * Thrown for a non-2xx answer; `message` is the server's one-line `{"message"}` when present,
 * `body` the whole JSON answer (e.g. a refused pause's `uncheckpointable` kernels).
 */
export class APIError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly body: Record<string, unknown> | null = null
  ) {
    super(message);
  }
}

/**
 * Call the jupyter_pause REST API (`<base_url>/jupyter-pause/api/<endPoint>`).
 * ServerConnection.makeRequest adds the token and the XSRF header.
 */
export async function requestAPI<T>(
  endPoint = '',
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const url = URLExt.join(settings.baseUrl, 'jupyter-pause', 'api', endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  let data: any = text;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      // Not JSON (e.g. an HTML 404 page): keep the text for the message below.
    }
  }
  if (!response.ok) {
    let message =
      data && typeof data === 'object' ? data.message || data.reason : '';
    if (!message) {
      message =
        response.status === 404
          ? 'the jupyter_pause server extension is not running on this server'
          : `${response.status} ${response.statusText}`;
    }
    throw new APIError(
      String(message),
      response.status,
      data && typeof data === 'object' ? data : null
    );
  }
  return data as T;
}

/**
 * How long a read (`GET status`, `GET policy`) may take before it counts as failed. The page
 * re-reads one at a time after events (`rereader.ts`), so a request that never answered (a
 * proxy holding the connection) would stop every re-read until the slow safety poll.
 */
export const READ_TIMEOUT_MS = 30_000;

/** The REST client, on the settings of JupyterLab's service manager. */
export class PauseAPI implements IPauseAPI {
  constructor(
    private _settings: ServerConnection.ISettings,
    private _readTimeoutMs = READ_TIMEOUT_MS
  ) {}

  status(): Promise<IStatus> {
    return requestAPI<IStatus>('status', this._read(), this._settings);
  }

  policy(): Promise<IPolicy> {
    return requestAPI<IPolicy>('policy', this._read(), this._settings);
  }

  private _read(): RequestInit {
    return { signal: AbortSignal.timeout(this._readTimeoutMs) };
  }

  cancelAutoPause(): Promise<IPolicy> {
    return this._post<IPolicy>('policy/cancel', {});
  }

  async start(
    kind: 'pause' | 'resume',
    loseState?: string[]
  ): Promise<IFlight> {
    // A manual pause never interrupts a running cell: the button is disabled meanwhile.
    const body =
      kind === 'pause'
        ? {
            trigger: 'manual',
            interrupt: false,
            ...(loseState ? { lose_state: loseState } : {})
          }
        : { trigger: 'manual' };
    const reply = await this._post<{ flight: IFlight }>(kind, body);
    return reply.flight;
  }

  async recompute(path: string, names: string[]): Promise<IReportVariable[]> {
    const reply = await this._post<{ variables?: IReportVariable[] }>(
      'recompute',
      {
        path,
        names
      }
    );
    return reply.variables ?? [];
  }

  async checkpoints(): Promise<ICheckpointListing[]> {
    const reply = await requestAPI<{ checkpoints?: ICheckpointListing[] }>(
      'checkpoints',
      {},
      this._settings
    );
    return reply.checkpoints ?? [];
  }

  restoreOffer(
    path: string,
    id?: string
  ): Promise<{ variables?: IReportVariable[] }> {
    return this._post('offers/restore', id ? { path, id } : { path });
  }

  async dismissOffer(path: string, id?: string): Promise<void> {
    // With its id: an offer the person never saw (a new one after a restart) stays.
    await this._post('offers/dismiss', id ? { path, id } : { path });
  }

  private _post<T>(endPoint: string, body: object): Promise<T> {
    return requestAPI<T>(
      endPoint,
      { method: 'POST', body: JSON.stringify(body) },
      this._settings
    );
  }
}

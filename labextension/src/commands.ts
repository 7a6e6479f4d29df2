/**
 * The commands: Pause, Resume (and the toolbar's toggle between them), Checkpoint Now,
 * Restore from Checkpoint, Show Pause/Resume Report.
 */

import { JupyterFrontEnd } from '@jupyterlab/application';
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { Kernel } from '@jupyterlab/services';
import {
  DisposableDelegate,
  DisposableSet,
  IDisposable
} from '@lumino/disposable';
import { Widget } from '@lumino/widgets';

import { PauseController } from './controller';
import { ITrans } from './format';
import { pauseIcon, resumeIcon } from './icons';
import { IMagicResult, plainError, runMagic } from './kernelcmd';
import { ILossDialog, pauseOrAsk } from './pauseanyway';
import { isFlightActive } from './status';

export namespace CommandIDs {
  /** The toolbar button: Pause or Resume, whichever applies. */
  export const toggle = 'jupyter-pause:toggle';
  export const pause = 'jupyter-pause:pause';
  export const resume = 'jupyter-pause:resume';
  export const checkpoint = 'jupyter-pause:checkpoint';
  export const restore = 'jupyter-pause:restore';
  export const showReport = 'jupyter-pause:show-report';
}

/** The commands of the command palette, in its order. */
export const PALETTE_COMMANDS = [
  CommandIDs.pause,
  CommandIDs.resume,
  CommandIDs.checkpoint,
  CommandIDs.restore,
  CommandIDs.showReport
];

type Commands = JupyterFrontEnd['commands'];
type CommandOptions = Parameters<Commands['addCommand']>[1];

export interface ICommandsOptions {
  commands: Commands;
  controller: PauseController;
  tracker: INotebookTracker | null;
  trans: ITrans;
  showReport: () => Promise<void>;
}

/** A dialog body showing captured kernel output as preformatted text. */
function preBody(text: string): Widget {
  const w = new Widget();
  w.addClass('jp-PauseOutput');
  const pre = document.createElement('pre');
  pre.textContent = text;
  w.node.appendChild(pre);
  return w;
}

/** The body of "Pause anyway?": what is lost, per kernel why, and the command that would fix it. */
function lossBody(dialog: ILossDialog): Widget {
  const w = new Widget();
  w.addClass('jp-PauseAnyway');
  const intro = document.createElement('p');
  intro.textContent = dialog.intro;
  const list = document.createElement('ul');
  for (const line of dialog.lines) {
    const item = document.createElement('li');
    const name = document.createElement('strong');
    name.textContent = line.name;
    item.append(name, `: ${line.why}`);
    if (line.command) {
      const code = document.createElement('code');
      code.textContent = line.command; // selectable, to copy
      item.append(document.createElement('br'), code);
    }
    list.appendChild(item);
  }
  w.node.append(intro, list);
  return w;
}

/** Ask "Pause anyway?"; Cancel is the default (Enter or Escape loses nothing). */
async function askPauseAnyway(dialog: ILossDialog): Promise<boolean> {
  const answer = await showDialog({
    title: dialog.title,
    body: lossBody(dialog),
    buttons: [
      Dialog.cancelButton({ label: dialog.cancel }),
      Dialog.warnButton({ label: dialog.accept })
    ],
    defaultButton: 0
  });
  return answer.button.accept;
}

/** The notebook a kernel command works on. */
interface INotebook {
  path: string;
  kernel: Kernel.IKernelConnection;
}

/** The current notebook's path and kernel, or null without either. */
function currentNotebook(tracker: INotebookTracker | null): INotebook | null {
  const panel = tracker?.currentWidget;
  const kernel = panel?.sessionContext.session?.kernel;
  return panel && kernel ? { path: panel.context.path, kernel } : null;
}

const reason = (error: unknown) => (error as Error)?.message || String(error);

/** `%checkpoint` in the notebook's kernel, with a notification while it runs and after. */
async function checkpointNow(
  notebook: INotebook,
  trans: ITrans
): Promise<IMagicResult | null> {
  const name = notebook.path;
  const run = runMagic(notebook.kernel, 'checkpoint');
  // Resolves with the counts ("3 saved, 1 skipped"), or null when the kernel sent none.
  const work = run.then(result => {
    if (!result.ok) {
      throw new Error(result.error || trans.__('no reason given'));
    }
    return result.report?.summary ?? null;
  });
  Notification.promise(work, {
    pending: {
      message: trans.__('Writing a checkpoint of %1…', name),
      options: {}
    },
    success: {
      message: (summary: unknown) =>
        typeof summary === 'string'
          ? trans.__('Checkpoint of %1 written: %2.', name, summary)
          : trans.__('Checkpoint of %1 written.', name),
      options: { autoClose: 8000 }
    },
    error: {
      message: (error: unknown) =>
        trans.__('Checkpoint of %1 failed: %2', name, reason(error)),
      options: { autoClose: false }
    }
  });
  return work.then(() => run).catch(() => null);
}

/** `%restore` in the notebook's kernel once confirmed; the output is behind "Show output". */
async function restoreNow(
  notebook: INotebook,
  trans: ITrans
): Promise<IMagicResult | null> {
  const name = notebook.path;
  const answer = await showDialog({
    title: trans.__('Restore from checkpoint'),
    body: trans.__(
      'Load the variables of the last checkpoint of %1 into its kernel? Variables with the same names are replaced.',
      name
    ),
    buttons: [
      Dialog.cancelButton({ label: trans.__('Cancel') }),
      Dialog.warnButton({ label: trans.__('Restore') })
    ]
  });
  if (!answer.button.accept) {
    return null;
  }
  const result = await runMagic(notebook.kernel, 'restore').catch(
    (error): IMagicResult => ({
      ok: false,
      output: '',
      error: String(error),
      report: null
    })
  );
  const actions = [
    {
      label: trans.__('Show output'),
      callback: () =>
        void showDialog({
          title: trans.__('Restore from checkpoint'),
          body: preBody(result.output || result.error || ''),
          buttons: [Dialog.okButton({ label: trans.__('Close') })]
        })
    }
  ];
  if (!result.ok) {
    const why = plainError(result.error) || trans.__('no reason given');
    Notification.error(trans.__('Restore of %1 failed: %2', name, why), {
      actions,
      autoClose: 10000
    });
  } else {
    const message = result.report
      ? trans.__('Restored %1: %2.', name, result.report.summary)
      : trans.__('Restored %1.', name);
    Notification.success(message, { actions, autoClose: 8000 });
  }
  return result;
}

/**
 * Which notebooks have a checkpoint in the store (`GET checkpoints`), so that *Restore from
 * Checkpoint* is disabled, with the reason, for one that has none. Re-read when the last
 * checkpoint or the offers change; unknown (null) until read, and then the command is enabled
 * and says what it finds.
 */
class CheckpointIndex {
  constructor(
    private _controller: PauseController,
    private _changed: () => void
  ) {}

  /** Whether the notebook at `path` has a checkpoint; null when not known. */
  has(path: string): boolean | null {
    if (!this._streams) {
      return null;
    }
    // The stream is the notebook's session name: its path, relative or absolute.
    return this._streams.some(s => s === path || s.endsWith('/' + path));
  }

  /** Re-read the listing when what it depends on changed (or `force`). */
  update(force = false): void {
    const st = this._controller.status;
    const key = JSON.stringify([
      st?.last_checkpoint?.id,
      st?.offers?.length,
      st?.state
    ]);
    if (!force && key === this._key) {
      return;
    }
    this._key = key;
    const seq = ++this._seq;
    this._controller
      .checkpoints()
      .then(list => {
        if (seq === this._seq) {
          this._streams = list.map(c => String(c.stream ?? ''));
          this._changed();
        }
      })
      .catch(() => {
        if (seq === this._seq) {
          this._streams = null; // unknown: the command tries and says what it finds
        }
      });
  }

  private _streams: string[] | null = null;
  private _key = '';
  private _seq = 0;
}

/** Add the commands; disposing the result removes them. */
export function addCommands(options: ICommandsOptions): IDisposable {
  const { commands, controller, tracker, trans, showReport } = options;
  const set = new DisposableSet();
  const add = (id: string, command: CommandOptions) =>
    set.add(commands.addCommand(id, command));
  const showError = (what: string, error: unknown) =>
    Notification.error(trans.__('%1: %2', what, reason(error)), {
      autoClose: false
    });
  // A pause that would lose a kernel's state asks first (pauseanyway.ts).
  const doPause = () =>
    pauseOrAsk(
      { pause: loseState => controller.pause(loseState), ask: askPauseAnyway },
      trans
    ).catch(error => void showError(trans.__('Cannot pause'), error));
  const doResume = () =>
    controller
      .resume()
      .catch(error => void showError(trans.__('Cannot resume'), error));
  const action = () => controller.actionView;

  add(CommandIDs.toggle, {
    label: () => action().label,
    caption: () => action().tooltip,
    icon: () => (action().mode === 'pause' ? pauseIcon : resumeIcon),
    isEnabled: () => action().enabled,
    execute: () => (action().mode === 'pause' ? doPause() : doResume())
  });
  add(CommandIDs.pause, {
    label: trans.__('Pause Workspace'),
    caption: () => action().tooltip,
    icon: pauseIcon,
    isEnabled: () => action().mode === 'pause' && action().enabled,
    execute: doPause
  });
  add(CommandIDs.resume, {
    label: trans.__('Resume Workspace'),
    caption: () => action().tooltip,
    icon: resumeIcon,
    isEnabled: () => action().mode === 'resume' && action().enabled,
    execute: doResume
  });

  // Run on the current notebook's kernel, when the workspace is running.
  const canUseKernel = () => {
    const status = controller.status;
    return (
      !!currentNotebook(tracker) &&
      !!status &&
      status.state !== 'paused' &&
      !isFlightActive(status)
    );
  };
  const onNotebook =
    (run: (notebook: INotebook) => Promise<IMagicResult | null>) => () => {
      const notebook = currentNotebook(tracker);
      return notebook ? run(notebook) : undefined;
    };

  add(CommandIDs.checkpoint, {
    label: trans.__('Checkpoint Now'),
    caption: trans.__(
      "Write a checkpoint of the current notebook's kernel (%checkpoint)"
    ),
    isEnabled: canUseKernel,
    execute: onNotebook(async notebook => {
      const result = await checkpointNow(notebook, trans);
      void controller.refresh();
      checkpoints.update(true);
      return result;
    })
  });
  const checkpoints = new CheckpointIndex(controller, () =>
    commands.notifyCommandChanged(CommandIDs.restore)
  );
  const noCheckpoint = () => {
    const notebook = currentNotebook(tracker);
    return !!notebook && checkpoints.has(notebook.path) === false;
  };
  add(CommandIDs.restore, {
    // Menus show no captions: the label says why it is disabled.
    label: () =>
      noCheckpoint()
        ? trans.__('Restore from Checkpoint (no checkpoint yet)')
        : trans.__('Restore from Checkpoint'),
    caption: () => {
      const notebook = currentNotebook(tracker);
      return notebook && noCheckpoint()
        ? trans.__(
            'There is no checkpoint of %1 yet: Checkpoint Now (or Pause) writes one.',
            notebook.path
          )
        : trans.__(
            'Load the last checkpoint of the current notebook into its kernel (%restore)'
          );
    },
    isEnabled: () => canUseKernel() && !noCheckpoint(),
    execute: onNotebook(notebook => restoreNow(notebook, trans))
  });
  add(CommandIDs.showReport, {
    label: trans.__('Show Pause/Resume Report'),
    caption: trans.__(
      'The current state and what came back after the last resume'
    ),
    execute: showReport
  });

  // The labels, captions and enabled states follow the controller.
  const notify = () => {
    for (const id of Object.values(CommandIDs)) {
      if (commands.hasCommand(id)) {
        commands.notifyCommandChanged(id);
      }
    }
  };
  const follow = () => {
    checkpoints.update();
    notify();
  };
  const onCurrent = () => notify();
  controller.changed.connect(follow);
  tracker?.currentChanged.connect(onCurrent);
  set.add(
    new DisposableDelegate(() => {
      controller.changed.disconnect(follow);
      tracker?.currentChanged.disconnect(onCurrent);
    })
  );
  return set;
}

/**
 * Holds every path that starts a kernel at once while the workspace is paused (or a pause or
 * resume runs): Kernel > Change Kernel / Restart Kernel / Reconnect, File > New > Console and
 * the launcher's Console cards, New Console for Notebook, the toolbar's kernel selector.
 *
 * Why here and not only in the notebooks' session contexts (KernelHold): a console is a new
 * widget whose kernel starts while it is created, and Restart, Change Kernel and the kernel
 * selector open JupyterLab's dialogs first. Refusing before the request means no dialog, no
 * console without a kernel, and no "Error Starting Kernel" from the server's 409.
 *
 * How: the commands read as disabled (their caption says why) and do nothing when run anyway
 * (a keyboard shortcut, the launcher, another extension); the session dialogs' `selectKernel`
 * and `restart` say why instead of opening. A 409 that still comes back (a path this list
 * misses) is told in one line instead of JupyterLab's error dialog.
 */

import { JupyterFrontEnd } from '@jupyterlab/application';
import { ISessionContext, ISessionContextDialogs } from '@jupyterlab/apputils';
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';
import { DisposableDelegate, IDisposable } from '@lumino/disposable';

import { isPausedRefusal, KernelHold } from './kernelhold';

/** The commands that start, restart or change a kernel (JupyterLab 4 and Notebook 7). */
export const KERNEL_START_COMMANDS: ReadonlySet<string> = new Set([
  'console:create',
  'console:change-kernel',
  'console:restart-kernel',
  'notebook:create-console',
  'notebook:create-subshell-console',
  'notebook:change-kernel',
  'notebook:restart-kernel',
  'notebook:restart-clear-output',
  'notebook:restart-run-all',
  'notebook:restart-and-run-to-selected',
  'notebook:reconnect-to-kernel',
  'kernelmenu:change',
  'kernelmenu:restart',
  'kernelmenu:restart-and-clear',
  'kernelmenu:reconnect-to-kernel',
  'runmenu:restart-and-run-all'
]);

type CommandRegistry = JupyterFrontEnd['commands'];

export interface IStartGuardOptions {
  commands: CommandRegistry;
  hold: KernelHold;
  /** Why a kernel cannot start now (the caption of a held command). */
  reason: () => string;
  /** The same in a few words, after a held command's label (menus show no captions). */
  shortReason: () => string;
  /** The session dialogs (restart, select kernel), when the app has them. */
  dialogs: ISessionContextDialogs | null;
}

type Patched<T> = { [K in keyof T]?: T[K] };

/** Hold the kernel-starting commands and dialogs; disposing restores them. */
export function guardKernelStarts(options: IStartGuardOptions): IDisposable {
  const { commands, hold, reason, shortReason, dialogs } = options;
  const held = (id: string) =>
    KERNEL_START_COMMANDS.has(id) && hold.mode !== 'free';
  // Own properties shadow CommandRegistry's prototype methods; menus, the palette, key
  // bindings and the launcher all call them on the registry.
  const own = commands as Patched<CommandRegistry>;
  const proto = Object.getPrototypeOf(commands) as CommandRegistry;
  own.isEnabled = (id: string, args?: ReadonlyPartialJSONObject) =>
    held(id) ? false : proto.isEnabled.call(commands, id, args);
  // The Kernel menu's items take their labels from the notebook's commands: only the
  // outermost label gets the reason, once.
  let depth = 0;
  own.label = (id: string, args?: ReadonlyPartialJSONObject) => {
    depth++;
    let label: string;
    try {
      label = proto.label.call(commands, id, args);
    } finally {
      depth--;
    }
    return held(id) && depth === 0 && label
      ? `${label} (${shortReason()})`
      : label;
  };
  own.caption = (id: string, args?: ReadonlyPartialJSONObject) =>
    held(id) ? reason() : proto.caption.call(commands, id, args);
  own.execute = (id: string, args?: ReadonlyPartialJSONObject) =>
    held(id) && hold.refuse()
      ? Promise.resolve(undefined)
      : proto.execute.call(commands, id, args);

  const restore: Array<() => void> = [];
  if (dialogs) {
    const d = dialogs as Patched<ISessionContextDialogs>;
    const select = dialogs.selectKernel.bind(dialogs);
    const restart = dialogs.restart.bind(dialogs);
    d.selectKernel = (context: ISessionContext) =>
      hold.refuse() ? Promise.resolve() : select(context);
    d.restart = (context: ISessionContext) =>
      hold.refuse() ? Promise.resolve(false) : restart(context);
    restore.push(() => {
      delete d.selectKernel;
      delete d.restart;
    });
  }
  return new DisposableDelegate(() => {
    delete own.isEnabled;
    delete own.label;
    delete own.caption;
    delete own.execute;
    restore.forEach(undo => undo());
    notifyKernelStartCommands(commands);
  });
}

/** Refresh the held commands' enabled state (call when the hold's mode changes). */
export function notifyKernelStartCommands(commands: CommandRegistry): void {
  for (const id of KERNEL_START_COMMANDS) {
    if (commands.hasCommand(id)) {
      commands.notifyCommandChanged(id);
    }
  }
}

/**
 * A kernel start the server refused because the workspace is paused: say it in one line
 * (`tell`) instead of JupyterLab's "Error Starting Kernel" dialog. Other errors keep it.
 */
export function softenPausedRefusal(
  context: ISessionContext,
  tell: () => void
): void {
  const target = context as unknown as {
    _displayKernelError?: (message: string, traceback: string) => Promise<void>;
  };
  const show = target._displayKernelError;
  if (
    typeof show !== 'function' ||
    (show as { __pauseSoft?: boolean }).__pauseSoft
  ) {
    return;
  }
  const soft = (message: string, traceback: string) => {
    if (isPausedRefusal(message)) {
      tell();
      return Promise.resolve();
    }
    return show.call(context, message, traceback);
  };
  (soft as { __pauseSoft?: boolean }).__pauseSoft = true;
  target._displayKernelError = soft;
}

/**
 * The jupyter-pause plugin: the Pause/Resume toolbar button, the state in the status bar, the
 * commands, the notifications, and the `IPauseController` service for other extensions.
 */

import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  ICommandPalette,
  ISessionContextDialogs,
  IToolbarWidgetRegistry,
  Notification
} from '@jupyterlab/apputils';
import {
  INotebookTracker,
  NotebookActions,
  NotebookPanel
} from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator, nullTranslator } from '@jupyterlab/translation';
import { CommandToolbarButton } from '@jupyterlab/ui-components';
import {
  DisposableDelegate,
  DisposableSet,
  IDisposable
} from '@lumino/disposable';

import { PauseAPI } from './api';
import { AutoPauseNotice } from './autopausenotice';
import { addCommands, CommandIDs, PALETTE_COMMANDS } from './commands';
import { PauseController } from './controller';
import { ITrans } from './format';
import { HoldMode, KernelHold } from './kernelhold';
import { reconnectNotebooks } from './reconnect';
import { showReportDialog } from './reportdialog';
import {
  guardKernelStarts,
  notifyKernelStartCommands,
  softenPausedRefusal
} from './startguard';
import { freedText } from './status';
import { PauseStatusItem } from './statusbar';
import { IPauseController } from './tokens';
import { StateFollower } from './transitions';

export * from './tokens';
export type * from './api';

const PLUGIN_ID = 'jupyter-pause:plugin';

/** What one activation set up, disposed by `deactivate`. */
let activation: DisposableSet | null = null;

/** Why a kernel cannot start now, for a held command's caption and the notice. */
function heldReason(
  mode: HoldMode,
  controller: PauseController,
  trans: ITrans
): string {
  return mode === 'paused'
    ? trans.__(
        'The workspace is paused (%1): resume it to start a kernel.',
        freedText(controller.status, trans)
      )
    : trans.__(
        'A pause or resume is under way: kernels can start once it is done.'
      );
}

/** Keeps notebooks from starting kernels while paused, and tells the person why. */
function createHold(
  app: JupyterFrontEnd,
  trans: ITrans,
  controller: PauseController
): KernelHold {
  let note: string | null = null;
  const notice = (message: string, actions: Notification.IAction[] = []) => {
    if (note) {
      Notification.dismiss(note);
    }
    note = Notification.info(message, { actions, autoClose: 8000 });
  };
  const resumeAction = {
    label: trans.__('Resume'),
    callback: () => void app.commands.execute(CommandIDs.resume)
  };
  const hold = new KernelHold({
    onStartRefused: mode =>
      notice(
        heldReason(mode, controller, trans),
        mode === 'paused' ? [resumeAction] : []
      ),
    onModeChanged: mode => {
      if (mode === 'free' && note) {
        Notification.dismiss(note); // "the cell did not run [Resume]" is stale once resumed
        note = null;
      }
      document.body.dataset.jpPauseHold = mode;
      notifyKernelStartCommands(app.commands);
    },
    onRunWhilePaused: () =>
      notice(
        trans.__(
          'The workspace is paused, so the cell did not run. Resume to run it.'
        ),
        [
          {
            label: trans.__('Resume'),
            callback: () => void app.commands.execute(CommandIDs.resume)
          }
        ]
      ),
    onRunWaiting: () =>
      notice(
        trans.__(
          'The cell will run when the workspace is back and the notebook is reconnected.'
        )
      )
  });
  return hold;
}

/** Each notebook: held while paused, and its busy kernel disables Pause. */
function followNotebooks(
  tracker: INotebookTracker,
  hold: KernelHold,
  controller: PauseController
): IDisposable {
  const attach = (panel: NotebookPanel) => {
    hold.attach(panel.sessionContext);
    // A start the server refused (409 while paused): one line, not "Error Starting Kernel".
    softenPausedRefusal(panel.sessionContext, () => {
      hold.refusedByServer();
      void controller.refresh(); // this page had not seen the pause yet
    });
  };
  tracker.forEach(attach);
  const onAdded = (_: INotebookTracker, panel: NotebookPanel) => {
    attach(panel);
    const key = panel.id;
    const update = (_sender?: unknown, status?: string) => {
      // A restart (Kernel > Restart, or the restart after the kernel died) empties the
      // kernel: the status must stop saying what the last resume restored.
      if (status === 'restarting' || status === 'autorestarting') {
        controller.noteRestart(panel.context.path);
      }
      controller.setBusy(
        key,
        panel.context.path,
        panel.sessionContext.kernelDisplayStatus === 'busy'
      );
    };
    panel.sessionContext.statusChanged.connect(update);
    panel.context.pathChanged.connect(update);
    panel.disposed.connect(() =>
      controller.setBusy(key, panel.context.path, false)
    );
    update();
  };
  tracker.widgetAdded.connect(onAdded);
  // A cell run in a restarted kernel: it is in use again (no longer just "its state is gone").
  const onScheduled = (_: unknown, args: { notebook: unknown }) => {
    const panel = tracker.find(p => p.content === args.notebook);
    if (panel) {
      controller.noteUsed(panel.context.path);
    }
  };
  NotebookActions.executionScheduled.connect(onScheduled);
  return new DisposableDelegate(() => {
    tracker.widgetAdded.disconnect(onAdded);
    NotebookActions.executionScheduled.disconnect(onScheduled);
  });
}

/** The safety poll interval follows the settings. */
function loadSettings(
  registry: ISettingRegistry,
  controller: PauseController
): void {
  registry
    .load(PLUGIN_ID)
    .then(settings => {
      const apply = () => {
        controller.setPollInterval(
          settings.get('pollInterval').composite as number
        );
      };
      apply();
      settings.changed.connect(apply);
      activation?.add(
        new DisposableDelegate(() => settings.changed.disconnect(apply))
      );
    })
    .catch(reason =>
      console.warn('jupyter-pause: cannot load settings', reason)
    );
}

function activate(
  app: JupyterFrontEnd,
  translator: ITranslator | null,
  palette: ICommandPalette | null,
  statusBar: IStatusBar | null,
  toolbarRegistry: IToolbarWidgetRegistry | null,
  tracker: INotebookTracker | null,
  settingRegistry: ISettingRegistry | null,
  sessionDialogs: ISessionContextDialogs | null
): IPauseController {
  const trans: ITrans = (translator ?? nullTranslator).load('jupyter_pause');
  const { commands, serviceManager } = app;
  const controller = new PauseController({
    api: new PauseAPI(serviceManager.serverSettings),
    events: serviceManager.events,
    trans
  });
  const disposables = (activation = new DisposableSet());
  disposables.add(controller);
  if (settingRegistry) {
    loadSettings(settingRegistry, controller);
  }

  const hold = createHold(app, trans, controller);
  if (tracker) {
    disposables.add(followNotebooks(tracker, hold, controller));
  }
  // Change Kernel, Restart, Reconnect, New Console, the kernel selector: held before the request.
  disposables.add(
    guardKernelStarts({
      commands,
      hold,
      reason: () => heldReason(hold.mode, controller, trans),
      shortReason: () =>
        hold.mode === 'paused'
          ? trans.__('paused: resume first')
          : trans.__('wait for the resume'),
      dialogs: sessionDialogs
    })
  );
  const currentPath = () => tracker?.currentWidget?.context.path ?? null;
  const showReport = () => showReportDialog(controller, trans, currentPath);
  disposables.add(
    addCommands({ commands, controller, tracker, trans, showReport })
  );
  if (palette) {
    const category = trans.__('Pause and Resume');
    for (const command of PALETTE_COMMANDS) {
      disposables.add(palette.addItem({ command, category }));
    }
  }
  // Toolbar: the item "jupyter-pause" of schema/plugin.json (movable/hideable in settings).
  toolbarRegistry?.addFactory<NotebookPanel>(
    'Notebook',
    'jupyter-pause',
    () => {
      const button = new CommandToolbarButton({
        commands,
        id: CommandIDs.toggle
      });
      button.addClass('jp-PauseButton');
      return button;
    }
  );
  if (statusBar) {
    const item = new PauseStatusItem(
      controller,
      trans,
      () => void showReport()
    );
    disposables.add(item);
    disposables.add(
      statusBar.registerStatusItem('jupyter-pause:status', {
        item,
        align: 'left',
        rank: 5,
        isActive: () => true
      })
    );
  } else {
    // Notebook 7 has no status bar: the state goes in its header, next to the kernel status
    // (its "menu" area; the kernel indicator is at rank 10010).
    const item = new PauseStatusItem(
      controller,
      trans,
      () => void showReport(),
      true
    );
    item.id = 'jp-PauseHeaderStatus';
    disposables.add(item);
    try {
      app.shell.add(item, 'menu', { rank: 10005 });
    } catch (reason) {
      console.warn('jupyter-pause: no header area for the state', reason);
    }
  }
  disposables.add(
    new StateFollower({
      controller,
      hold,
      trans,
      reconnect: paused => reconnectNotebooks(serviceManager, tracker, paused),
      showReport: () => void showReport()
    })
  );
  // The idle policy's countdown with a Cancel button (GET policy, POST policy/cancel).
  disposables.add(new AutoPauseNotice(controller, trans));

  void controller.refresh();
  void controller.refreshPolicy();
  return controller;
}

const plugin: JupyterFrontEndPlugin<IPauseController> = {
  id: PLUGIN_ID,
  description:
    'Pause button, live pause/resume state in the status bar, and the resume report.',
  autoStart: true,
  provides: IPauseController,
  optional: [
    ITranslator,
    ICommandPalette,
    IStatusBar,
    IToolbarWidgetRegistry,
    INotebookTracker,
    ISettingRegistry,
    ISessionContextDialogs
  ],
  activate,
  deactivate: () => {
    activation?.dispose();
    activation = null;
  }
};

export default plugin;

import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  ISessionContext,
  IToolbarWidgetRegistry,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Session } from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator, nullTranslator } from '@jupyterlab/translation';
import { CommandToolbarButton } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { AutoPauseNotice } from './autopause';
import { PauseController, IStatusChange } from './controller';
import { pauseIcon, resumeIcon } from './icons';
import { runMagic } from './kernelcmd';
import { holdModeOf, KernelHold } from './kernelhold';
import { hasNewReport, isFlightActive, IStatus, ITrans, reportHeadline } from './model';
import { showReportDialog } from './report';
import { PauseStatusItem } from './statusbar';

const PLUGIN_ID = 'jupyter-pause:plugin';

namespace CommandIDs {
  /** The toolbar button: Pause or Resume, whichever applies. */
  export const toggle = 'jupyter-pause:toggle';
  export const pause = 'jupyter-pause:pause';
  export const resume = 'jupyter-pause:resume';
  export const checkpoint = 'jupyter-pause:checkpoint';
  export const restore = 'jupyter-pause:restore';
  export const showReport = 'jupyter-pause:show-report';
}

const ALL_COMMANDS = [
  CommandIDs.toggle,
  CommandIDs.pause,
  CommandIDs.resume,
  CommandIDs.checkpoint,
  CommandIDs.restore,
  CommandIDs.showReport
];

/** A dialog body showing captured kernel output as preformatted text. */
function preBody(text: string): Widget {
  const w = new Widget();
  w.addClass('jp-PauseOutput');
  const pre = document.createElement('pre');
  pre.textContent = text;
  w.node.appendChild(pre);
  return w;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'Pause button, live pause/resume state in the status bar, and the resume report.',
  autoStart: true,
  optional: [
    ITranslator,
    ICommandPalette,
    IStatusBar,
    IToolbarWidgetRegistry,
    INotebookTracker,
    ISettingRegistry
  ],
  activate: (
    app: JupyterFrontEnd,
    translator: ITranslator | null,
    palette: ICommandPalette | null,
    statusBar: IStatusBar | null,
    toolbarRegistry: IToolbarWidgetRegistry | null,
    tracker: INotebookTracker | null,
    settingRegistry: ISettingRegistry | null
  ) => {
    const trans: ITrans = (translator ?? nullTranslator).load('jupyter_pause');
    const { commands, serviceManager } = app;
    const controller = new PauseController({
      serverSettings: serviceManager.serverSettings,
      events: serviceManager.events,
      trans
    });

    if (settingRegistry) {
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          const apply = () => {
            const seconds = settings.get('pollInterval').composite as number;
            controller.setPollInterval(seconds);
          };
          apply();
          settings.changed.connect(apply);
        })
        .catch(reason => console.warn('jupyter-pause: cannot load settings', reason));
    }

    controller.changed.connect(() => {
      for (const id of ALL_COMMANDS) {
        if (commands.hasCommand(id)) {
          commands.notifyCommandChanged(id);
        }
      }
    });

    const showError = (what: string, error: unknown) => {
      const message = (error as Error)?.message || String(error);
      Notification.error(trans.__('%1: %2', what, message), { autoClose: false });
    };

    // No notebook starts a kernel of its own while paused or during a pause or resume.
    let holdNote: string | null = null;
    const holdNotice = (message: string, actions: Notification.IAction[] = []) => {
      if (holdNote) {
        Notification.dismiss(holdNote);
      }
      holdNote = Notification.info(message, { actions, autoClose: 8000 });
    };
    const hold = new KernelHold({
      onRunWhilePaused: () =>
        holdNotice(
          trans.__('The workspace is paused, so the cell did not run. Resume to run it.'),
          [{ label: trans.__('Resume'), callback: () => void commands.execute(CommandIDs.resume) }]
        ),
      onRunWaiting: () =>
        holdNotice(
          trans.__('The cell will run when the workspace is back and the notebook is reconnected.')
        )
    });
    tracker?.forEach(panel => hold.attach(panel.sessionContext));
    tracker?.widgetAdded.connect((_, panel) => hold.attach(panel.sessionContext));

    const doPause = async () => {
      hold.set('busy'); // from the click on: the server's answer may come after a cell run
      try {
        await controller.pause();
      } catch (error) {
        showError(trans.__('Cannot pause'), error);
      }
    };
    const doResume = async () => {
      hold.expectResume();
      try {
        await controller.resume();
      } catch (error) {
        hold.cancelResume(controller.status);
        showError(trans.__('Cannot resume'), error);
      }
    };
    const showReport = () => showReportDialog(controller, trans);

    commands.addCommand(CommandIDs.toggle, {
      label: () => controller.actionView.label,
      caption: () => controller.actionView.tooltip,
      icon: () => (controller.actionView.mode === 'pause' ? pauseIcon : resumeIcon),
      isEnabled: () => controller.actionView.enabled,
      execute: () => (controller.actionView.mode === 'pause' ? doPause() : doResume())
    });
    commands.addCommand(CommandIDs.pause, {
      label: trans.__('Pause Workspace'),
      caption: () => controller.actionView.tooltip,
      icon: pauseIcon,
      isEnabled: () => controller.actionView.mode === 'pause' && controller.actionView.enabled,
      execute: doPause
    });
    commands.addCommand(CommandIDs.resume, {
      label: trans.__('Resume Workspace'),
      caption: () => controller.actionView.tooltip,
      icon: resumeIcon,
      isEnabled: () => controller.actionView.mode === 'resume' && controller.actionView.enabled,
      execute: doResume
    });

    const currentKernel = () => tracker?.currentWidget?.sessionContext.session?.kernel ?? null;
    const canUseKernel = () => {
      const status = controller.status;
      return !!currentKernel() && !!status && status.state !== 'paused' && !isFlightActive(status);
    };

    commands.addCommand(CommandIDs.checkpoint, {
      label: trans.__('Checkpoint Now'),
      caption: trans.__("Write a checkpoint of the current notebook's kernel (%checkpoint)"),
      isEnabled: canUseKernel,
      execute: async () => {
        const kernel = currentKernel();
        const panel = tracker?.currentWidget;
        if (!kernel || !panel) {
          return;
        }
        const name = panel.context.path;
        const work = runMagic(kernel, 'checkpoint').then(result => {
          if (!result.ok) {
            throw new Error(result.summary || trans.__('no reason given'));
          }
          return result;
        });
        Notification.promise(work, {
          pending: { message: trans.__('Writing a checkpoint of %1…', name), options: {} },
          success: {
            message: (result: any) => trans.__('Checkpoint of %1 written: %2.', name, result.counts),
            options: { autoClose: 8000 }
          },
          error: {
            message: (error: any) =>
              trans.__('Checkpoint of %1 failed: %2', name, error?.message ?? String(error)),
            options: { autoClose: false }
          }
        });
        const result = await work.catch(() => null);
        void controller.refresh();
        return result;
      }
    });

    commands.addCommand(CommandIDs.restore, {
      label: trans.__('Restore from Checkpoint'),
      caption: trans.__(
        "Load the last checkpoint of the current notebook into its kernel (%restore)"
      ),
      isEnabled: canUseKernel,
      execute: async () => {
        const kernel = currentKernel();
        const panel = tracker?.currentWidget;
        if (!kernel || !panel) {
          return;
        }
        const name = panel.context.path;
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
          return;
        }
        const result = await runMagic(kernel, 'restore').catch(error => ({
          ok: false,
          output: String(error),
          summary: String(error),
          counts: String(error)
        }));
        const actions = [
          {
            label: trans.__('Show output'),
            callback: () =>
              void showDialog({
                title: trans.__('Restore from checkpoint'),
                body: preBody(result.output || result.summary),
                buttons: [Dialog.okButton({ label: trans.__('Close') })]
              })
          }
        ];
        if (result.ok) {
          Notification.success(trans.__('Restored %1: %2.', name, result.counts), {
            actions,
            autoClose: 8000
          });
        } else {
          Notification.error(trans.__('Restore of %1 failed: %2', name, result.summary), {
            actions,
            autoClose: false
          });
        }
        return result;
      }
    });

    commands.addCommand(CommandIDs.showReport, {
      label: trans.__('Show Pause/Resume Report'),
      caption: trans.__('The current state and what came back after the last resume'),
      execute: showReport
    });

    if (palette) {
      const category = trans.__('Pause and Resume');
      for (const command of [
        CommandIDs.pause,
        CommandIDs.resume,
        CommandIDs.checkpoint,
        CommandIDs.restore,
        CommandIDs.showReport
      ]) {
        palette.addItem({ command, category });
      }
    }

    // Toolbar: the item "jupyter-pause" of schema/plugin.json (movable/hideable in settings).
    if (toolbarRegistry) {
      toolbarRegistry.addFactory<NotebookPanel>('Notebook', 'jupyter-pause', () => {
        const button = new CommandToolbarButton({ commands, id: CommandIDs.toggle });
        button.addClass('jp-PauseButton');
        return button;
      });
    }

    // Busy kernels: the button is disabled while any notebook runs a cell.
    if (tracker) {
      tracker.widgetAdded.connect((_, panel) => {
        const key = panel.id;
        const update = () =>
          controller.setBusy(
            key,
            panel.context.path,
            panel.sessionContext.kernelDisplayStatus === 'busy'
          );
        panel.sessionContext.statusChanged.connect(update);
        panel.context.pathChanged.connect(update);
        panel.disposed.connect(() => controller.setBusy(key, panel.context.path, false));
        update();
      });
    }

    if (statusBar) {
      const item = new PauseStatusItem(controller, trans, () => void showReport());
      statusBar.registerStatusItem('jupyter-pause:status', {
        item,
        align: 'left',
        rank: 5,
        isActive: () => true
      });
    }

    // Notifications and session refresh on state transitions.
    let seenReport: string | null | undefined = undefined;
    let notifiedFailure: string | null = null;
    let pausedNote: string | null = null;
    controller.statusRead.connect((_, change: IStatusChange) => {
      const { previous, current } = change;
      if (!current) {
        return;
      }
      if (seenReport === undefined) {
        seenReport = current.last_report?.flight_id ?? null;
      }
      let synced: Promise<unknown> = Promise.resolve();
      const prevState = previous?.state;
      if (prevState && prevState !== current.state) {
        if (['paused', 'ready', 'running', 'failed'].includes(current.state)) {
          // The server stopped or started kernels: follow at once rather than at the next
          // session poll, so the first cell after a resume reaches the restored kernel.
          synced = reconnectPanels().catch(reason =>
            console.warn('jupyter-pause: could not reconnect notebooks', reason)
          );
        }
        if (prevState === 'paused' && pausedNote) {
          Notification.dismiss(pausedNote); // stale once a resume starts
          pausedNote = null;
        }
        if (current.state === 'paused') {
          pausedNote = Notification.info(
            trans.__('Paused: the checkpoint is written and the accelerator is free. Resume when you are ready.'),
            { autoClose: 6000 }
          );
        }
      }
      // Held while paused or in a flight; freed only once the notebooks follow the server's
      // kernels, and only if no newer answer started another flight meanwhile.
      const mode = hold.modeFor(current);
      if (mode !== 'free') {
        hold.set(mode);
      } else {
        void synced.then(() => {
          if (holdModeOf(controller.status) === 'free') {
            hold.set('free');
          }
        });
      }
      announceFailure(previous, current);
      if (hasNewReport(seenReport, current) && current.last_report) {
        const report = current.last_report;
        seenReport = report.flight_id;
        if (report.outcome === 'failed') {
          return; // announced by announceFailure
        }
        const actions = [{ label: trans.__('Show report'), callback: () => void showReport() }];
        const headline = reportHeadline(report, trans);
        const incomplete = (report.kernels ?? []).some(k =>
          (k.variables ?? []).some(v => !['live', 'restored', 'recomputed'].includes(v.status))
        );
        void synced.then(() => {
          if (incomplete) {
            Notification.warning(headline, { actions, autoClose: false });
          } else {
            Notification.success(headline, { actions, autoClose: 15000 });
          }
        });
      }
    });

    /**
     * Point each open notebook at the kernel the server now has for its path. Pausing stops
     * the kernels, and jupyter_server then forgets their sessions; the resume recreates them,
     * but a notebook whose session was dropped meanwhile would stay on "No Kernel".
     */
    async function reconnectPanels(): Promise<void> {
      await Promise.all([
        serviceManager.sessions.refreshRunning(),
        serviceManager.kernels.refreshRunning()
      ]);
      if (!tracker) {
        return;
      }
      const sessionByPath = new Map<string, Session.IModel>();
      for (const model of serviceManager.sessions.running()) {
        if (model.kernel) {
          sessionByPath.set(model.path, model);
        }
      }
      const work: Promise<unknown>[] = [];
      tracker.forEach(panel => {
        const context = panel.sessionContext;
        const model = sessionByPath.get(panel.context.path);
        const kernelId = model?.kernel?.id;
        if (!model || !kernelId || context.isDisposed || context.session?.kernel?.id === kernelId) {
          return;
        }
        if (!context.session && adoptSession(context, model)) {
          return;
        }
        work.push(context.changeKernel({ id: kernelId }));
      });
      await Promise.all(work);
    }

    /**
     * Connect a notebook that lost its session (its kernel was stopped by the pause) to the
     * session the server now has for its path, as JupyterLab does when it opens a notebook.
     * changeKernel() would start a second session on the same kernel: without a session it
     * POSTs under a temporary path and only then renames it to the notebook's path.
     * SessionContext has no public way to adopt an existing session, so this uses the method
     * its own initialization uses, and falls back to changeKernel() if that ever goes away.
     * The kernel hold keeps JupyterLab from starting a session of its own meanwhile, whose
     * completion would shut down the adopted one.
     */
    function adoptSession(context: ISessionContext, model: Session.IModel): boolean {
      const handle = (context as unknown as {
        _handleNewSession?: (session: Session.ISessionConnection) => unknown;
      })._handleNewSession;
      if (typeof handle !== 'function') {
        return false;
      }
      handle.call(context, serviceManager.sessions.connectTo({ model }));
      return true;
    }

    function announceFailure(previous: IStatus | null, current: IStatus): void {
      if (current.state !== 'failed') {
        notifiedFailure = null;
        return;
      }
      const key = `${current.flight?.id ?? ''}:${current.reason ?? ''}`;
      if (!previous || notifiedFailure === key) {
        notifiedFailure = key; // a failure from before the page loaded stays in the status bar
        return;
      }
      notifiedFailure = key;
      const what =
        current.flight?.kind === 'resume' ? trans.__('Resume failed') : trans.__('Pause failed');
      // The hint (what to do) is in the status tooltip and behind "Details": toasts are short.
      const reason = (current.reason || trans.__('no reason given')).replace(/\.$/, '');
      Notification.error(`${what}: ${reason}.`, {
        actions: [{ label: trans.__('Details'), callback: () => void showReport() }],
        autoClose: false
      });
    }

    // The idle policy's countdown with a Cancel button (GET policy, POST policy/cancel).
    new AutoPauseNotice(controller, trans);

    void controller.refresh();
    void controller.refreshPolicy();
    console.debug('jupyter-pause: activated');
  }
};

export default plugin;

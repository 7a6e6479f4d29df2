import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import type { IKernelReport, IReportVariable } from './api';
import { PauseController } from './controller';
import { formatBytes, formatDuration, formatTime, ITrans } from './format';
import { durationRows, groupVariables, outcomeText, reportHeadline } from './report';

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className?: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text; // never innerHTML: names and reasons come from user code
  }
  return node;
}

/**
 * The body of the details dialog: current state (reason, what to do), the last resume
 * report grouped by what happened to each variable, and the step timings.
 */
export class PauseReportBody extends Widget {
  constructor(
    private _controller: PauseController,
    private _trans: ITrans
  ) {
    super();
    this.addClass('jp-PauseReport');
    _controller.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._controller.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _results = new Map<string, string>();
  private _running = new Set<string>();

  private _render(): void {
    const trans = this._trans;
    const status = this._controller.status;
    const view = this._controller.statusView;
    const root = this.node;
    root.replaceChildren();

    // Current state.
    const state = el('section', 'jp-PauseReport-state');
    state.append(el('h3', undefined, trans.__('Current state')));
    const label = el('p', 'jp-PauseReport-stateLabel', view.label);
    label.dataset.severity = view.severity;
    state.append(label);
    if (status?.reason) {
      state.append(el('p', 'jp-PauseReport-reason', trans.__('Reason: %1', status.reason)));
    }
    if (status?.hint) {
      state.append(el('p', 'jp-PauseReport-hint', trans.__('What to do: %1', status.hint)));
    }
    if (this._controller.error) {
      state.append(el('p', 'jp-PauseReport-reason', this._controller.error));
    }
    if (status?.last_checkpoint) {
      const cp = status.last_checkpoint;
      state.append(
        el(
          'p',
          undefined,
          trans.__(
            'Last checkpoint: %1, %2, %3.',
            cp.id,
            cp.created ? formatTime(cp.created) : '?',
            formatBytes(cp.bytes_total ?? null)
          )
        )
      );
    }
    root.append(state);

    const report = status?.last_report;
    if (!report) {
      root.append(el('p', 'jp-PauseReport-empty', trans.__('No resume has been reported yet.')));
      return;
    }

    // Headline of the last resume.
    const head = el('section', 'jp-PauseReport-summary');
    head.append(el('h3', undefined, trans.__('Last resume')));
    head.append(el('p', 'jp-PauseReport-headline', reportHeadline(report, trans)));
    root.append(head);

    for (const kernel of report.kernels ?? []) {
      root.append(this._renderKernel(kernel));
    }

    // Timings: resume request -> kernel usable.
    const rows = durationRows(report, trans);
    if (rows.length > 0) {
      const section = el('section', 'jp-PauseReport-timings');
      section.append(el('h3', undefined, trans.__('How long each step took')));
      const table = el('table');
      rows.forEach((row, i) => {
        const tr = el('tr', i === rows.length - 1 ? 'jp-PauseReport-total' : undefined);
        tr.append(el('th', undefined, row.label), el('td', undefined, formatDuration(row.seconds)));
        table.append(tr);
      });
      section.append(table);
      root.append(section);
    }
  }

  private async _recompute(path: string, names: string[]): Promise<void> {
    const trans = this._trans;
    this._running.add(path);
    this._results.delete(path);
    this._render();
    let text: string;
    try {
      const vars = await this._controller.recompute(path, names);
      const ok = vars.filter(v => v.status === 'recomputed').map(v => v.name);
      const bad = vars.filter(v => v.status !== 'recomputed');
      text = trans.__('Recomputed: %1.', ok.join(', ') || trans.__('nothing'));
      if (bad.length) {
        const why = bad.map(v => `${v.name} (${v.reason || v.status})`).join(', ');
        text += ' ' + trans.__('Not recomputed: %1.', why);
      }
    } catch (error) {
      text = trans.__('Recompute failed: %1', (error as Error).message);
    }
    this._running.delete(path);
    this._results.set(path, text);
    if (!this.isDisposed) {
      this._render();
    }
  }

  private _renderKernel(kernel: IKernelReport): HTMLElement {
    const trans = this._trans;
    const section = el('section', 'jp-PauseReport-kernel');
    const title = el('h4');
    title.textContent = `${kernel.path || kernel.kernel_id || '?'}: ${outcomeText(kernel.outcome, trans)}`;
    section.append(title);
    if (kernel.reason) {
      const failed = kernel.outcome === 'failed';
      section.append(el('p', failed ? 'jp-PauseReport-reason' : 'jp-PauseReport-meta', kernel.reason));
    }
    if (kernel.checkpoint_id && kernel.outcome === 'restored') {
      section.append(el('p', 'jp-PauseReport-meta', trans.__('Checkpoint %1', kernel.checkpoint_id)));
    }
    // The server marks recomputed variables in its report (POST recompute updates it).
    const groups = groupVariables(kernel.variables ?? []);
    const list = (heading: string, vars: IReportVariable[], group: string) => {
      if (vars.length === 0) {
        return;
      }
      const block = el('div', 'jp-PauseReport-group');
      block.dataset.group = group;
      block.append(el('h5', undefined, `${heading} (${vars.length})`));
      const ul = el('ul');
      for (const v of vars) {
        const li = el('li');
        li.append(el('code', undefined, v.name));
        const details: string[] = [];
        if (v.kind) {
          details.push(v.kind);
        }
        if (typeof v.size === 'number' && (v.size > 0 || group === 'restored')) {
          details.push(formatBytes(v.size));
        }
        if (details.length) {
          li.append(el('span', 'jp-PauseReport-meta', ` ${details.join(', ')}`));
        }
        if (v.reason) {
          li.append(el('span', 'jp-PauseReport-why', ` — ${v.reason}`));
        }
        if (v.cell?.execution_count != null && group === 'recomputable') {
          li.append(
            el('span', 'jp-PauseReport-meta', ' ' + trans.__('(cell [%1])', v.cell.execution_count))
          );
        }
        ul.append(li);
      }
      block.append(ul);
      section.append(block);
      return block;
    };
    list(trans.__('Came back live'), groups.live, 'live');
    list(trans.__('Restored from the checkpoint'), groups.restored, 'restored');
    list(trans.__('Recomputed'), groups.recomputed, 'recomputed');
    const recomputable = list(trans.__('Can be recomputed'), groups.recomputable, 'recomputable');
    const path = kernel.path;
    if (recomputable && path) {
      const names = groups.recomputable.map(v => v.name);
      const button = el('button', 'jp-mod-styled jp-mod-accept jp-PauseReport-recompute');
      button.textContent = trans.__('Recompute %1', names.join(', '));
      button.setAttribute('aria-label', trans.__('Re-run the cells that made %1', names.join(', ')));
      button.disabled = this._running.has(path);
      button.addEventListener('click', () => void this._recompute(path, names));
      recomputable.append(button);
    }
    // Kept across re-renders (a status event re-renders the whole body).
    const result = path ? this._results.get(path) : undefined;
    if (path && (result || this._running.has(path))) {
      const p = el('p', 'jp-PauseReport-result', result ?? trans.__('Re-running the recorded cells…'));
      p.setAttribute('aria-live', 'polite');
      section.append(p);
    }
    list(trans.__('Skipped'), groups.skipped, 'skipped');
    list(trans.__('Failed'), groups.failed, 'failed');
    if (!(kernel.variables ?? []).length) {
      section.append(el('p', 'jp-PauseReport-empty', trans.__('No variables.')));
    }
    return section;
  }
}

/** Open the details / report dialog. */
export async function showReportDialog(controller: PauseController, trans: ITrans): Promise<void> {
  void controller.refresh();
  const body = new PauseReportBody(controller, trans);
  try {
    await showDialog({
      title: trans.__('Pause and resume'),
      body,
      buttons: [Dialog.okButton({ label: trans.__('Close') })]
    });
  } finally {
    body.dispose();
  }
}

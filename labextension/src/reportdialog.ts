import { Clipboard, Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import type { IKernelReport, IReportVariable } from './api';
import { commandParts } from './commandtext';
import { PauseController } from './controller';
import { formatBytes, formatDuration, formatTime, ITrans } from './format';
import { canRestoreOffer, capitalise, IOffer, restartSentence } from './offers';
import {
  displayName,
  durationRows,
  groupVariables,
  kernelOutcomeText,
  orderKernels,
  reportHeadline
} from './report';

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

/** A paragraph of text whose commands (between backticks) show as code, each with a button
 * that copies it: the install command of a kernel without jupyter-pause-kernel. */
function withCommands(
  className: string,
  text: string,
  trans: ITrans
): HTMLParagraphElement {
  const p = el('p', className);
  for (const part of commandParts(text)) {
    if (!part.command) {
      p.append(document.createTextNode(part.text));
      continue;
    }
    p.append(el('code', 'jp-PauseReport-command', part.text));
    const copy = el(
      'button',
      'jp-PauseReport-copy jp-mod-styled',
      trans.__('Copy')
    );
    copy.type = 'button';
    copy.title = trans.__('Copy this command');
    copy.addEventListener('click', () => {
      Clipboard.copyToSystem(part.text);
      copy.textContent = trans.__('Copied');
    });
    p.append(copy);
  }
  return p;
}

/**
 * The body of the details dialog: current state (reason, what to do), the last resume
 * report grouped by what happened to each variable, and the step timings.
 */
export class PauseReportBody extends Widget {
  constructor(
    private _controller: PauseController,
    private _trans: ITrans,
    /** The path of the notebook the person is looking at (shown first), or null. */
    private _current: () => string | null = () => null
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
  /** Folds the person opened, kept across re-renders (a status event re-renders the body). */
  private _open = new Set<string>();

  private _fold(key: string, details: HTMLDetailsElement): HTMLDetailsElement {
    details.open = this._open.has(key);
    details.addEventListener('toggle', () => {
      if (details.open) {
        this._open.add(key);
      } else {
        this._open.delete(key);
      }
    });
    return details;
  }
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
      state.append(
        withCommands(
          'jp-PauseReport-reason',
          trans.__('Reason: %1', status.reason),
          trans
        )
      );
    }
    if (status?.hint) {
      state.append(
        withCommands(
          'jp-PauseReport-hint',
          trans.__('What to do: %1', status.hint),
          trans
        )
      );
    }
    if (this._controller.error) {
      state.append(el('p', 'jp-PauseReport-reason', this._controller.error));
    }
    this._renderOffers(state);
    if (status?.last_checkpoint) {
      const cp = status.last_checkpoint;
      state.append(
        el(
          'p',
          undefined,
          trans.__(
            'Last checkpoint: %1, %2.',
            cp.created ? formatTime(cp.created) : '?',
            formatBytes(cp.bytes_total ?? null)
          )
        )
      );
      state.append(
        this._fold(
          'checkpoint',
          detailsOf(trans, [trans.__('Checkpoint id: %1', cp.id)])
        )
      );
    }
    root.append(state);

    const report = status?.last_report;
    if (!report) {
      root.append(
        el(
          'p',
          'jp-PauseReport-empty',
          trans.__('No resume has been reported yet.')
        )
      );
      return;
    }

    // Headline of the last resume.
    const head = el('section', 'jp-PauseReport-summary');
    head.append(el('h3', undefined, trans.__('Last resume')));
    head.append(
      el('p', 'jp-PauseReport-headline', reportHeadline(report, trans))
    );
    root.append(head);

    // The notebook the person is looking at first; the others folded (names on demand).
    const { first, rest } = orderKernels(report.kernels, this._current());
    for (const kernel of first) {
      root.append(this._renderKernel(kernel));
    }
    if (rest.length) {
      const others = el('details', 'jp-PauseReport-others');
      others.append(
        el(
          'summary',
          undefined,
          trans._n(
            '%1 other notebook or console',
            '%1 other notebooks and consoles',
            rest.length
          )
        )
      );
      rest.forEach(kernel => others.append(this._renderKernel(kernel)));
      root.append(this._fold('others', others));
    }

    // Timings: resume request -> kernel usable.
    const rows = durationRows(report, trans);
    if (rows.length > 0) {
      const section = el('section', 'jp-PauseReport-timings');
      section.append(el('h3', undefined, trans.__('How long each step took')));
      const table = el('table');
      rows.forEach((row, i) => {
        const tr = el(
          'tr',
          i === rows.length - 1 ? 'jp-PauseReport-total' : undefined
        );
        tr.append(
          el('th', undefined, row.label),
          el('td', undefined, formatDuration(row.seconds))
        );
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
        const why = bad
          .map(v => `${v.name} (${v.reason || v.status})`)
          .join(', ');
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

  /** A dead or restarted kernel: what is gone, and the saved state with Restore / Dismiss. */
  private _renderOffers(into: HTMLElement): void {
    const trans = this._trans;
    const status = this._controller.status;
    const offers: IOffer[] = status?.offers ?? [];
    const restarted = this._controller.restarts.filter(
      r => !r.used && !offers.some(o => o.path === r.path)
    );
    for (const offer of offers) {
      const block = el('div', 'jp-PauseReport-offer');
      block.dataset.path = offer.path;
      const sentence = capitalise(restartSentence(offer, null, trans));
      block.append(
        el('p', undefined, `${displayName(offer.path, trans)}: ${sentence}`)
      );
      if (offer.used_since) {
        block.append(
          el(
            'p',
            'jp-PauseReport-meta',
            trans.__(
              'Cells were run since: restoring puts the saved variables over the current ones.'
            )
          )
        );
      }
      if (canRestoreOffer(offer)) {
        const restore = el(
          'button',
          'jp-mod-styled jp-mod-accept',
          trans.__('Restore')
        );
        restore.disabled = this._running.has(`offer:${offer.path}`);
        restore.addEventListener(
          'click',
          () => void this._takeOffer(offer, true)
        );
        const dismiss = el(
          'button',
          'jp-mod-styled jp-mod-reject',
          trans.__('Dismiss')
        );
        dismiss.addEventListener(
          'click',
          () => void this._takeOffer(offer, false)
        );
        block.append(restore, dismiss);
      }
      const result = this._results.get(`offer:${offer.path}`);
      if (result) {
        block.append(el('p', 'jp-PauseReport-result', result));
      }
      into.append(block);
    }
    for (const r of restarted) {
      const sentence = restartSentence(
        null,
        status?.last_checkpoint?.created ?? null,
        trans
      );
      into.append(
        el(
          'p',
          'jp-PauseReport-offer',
          `${displayName(r.path, trans)}: ${capitalise(sentence)}`
        )
      );
    }
  }

  private async _takeOffer(offer: IOffer, restore: boolean): Promise<void> {
    const trans = this._trans;
    const key = `offer:${offer.path}`;
    this._running.add(key);
    this._render();
    try {
      if (restore) {
        const vars = await this._controller.restoreOffer(offer.path, offer.id);
        this._results.set(
          key,
          trans._n(
            'Restored %1 variable.',
            'Restored %1 variables.',
            vars.length
          )
        );
      } else {
        await this._controller.dismissOffer(offer.path, offer.id);
      }
    } catch (error) {
      this._results.set(
        key,
        trans.__('Not restored: %1', (error as Error).message)
      );
    }
    this._running.delete(key);
    if (!this.isDisposed) {
      this._render();
    }
  }

  private _renderKernel(kernel: IKernelReport): HTMLElement {
    const trans = this._trans;
    const section = el('section', 'jp-PauseReport-kernel');
    const title = el('h4');
    const count = (kernel.variables ?? []).length;
    const outcome = kernelOutcomeText(
      kernel.outcome,
      trans,
      count,
      kernel.state_not_saved ?? null
    );
    title.textContent = `${displayName(kernel.path, trans)}: ${outcome}`;
    section.dataset.path = kernel.path ?? '';
    section.append(title);
    if (kernel.reason && kernel.outcome === 'failed') {
      section.append(
        withCommands('jp-PauseReport-reason', kernel.reason, trans)
      );
    }
    // How it happened, ids and paths: on demand.
    const facts = [
      kernel.path ? trans.__('Path: %1', kernel.path) : '',
      kernel.reason && kernel.outcome !== 'failed'
        ? trans.__('How: %1', kernel.reason)
        : '',
      kernel.checkpoint_id
        ? trans.__('Checkpoint id: %1', kernel.checkpoint_id)
        : '',
      kernel.kernel_id ? trans.__('Kernel id: %1', kernel.kernel_id) : ''
    ];
    section.append(
      this._fold(
        `kernel:${kernel.path ?? kernel.kernel_id}`,
        detailsOf(trans, facts)
      )
    );
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
        if (
          typeof v.size === 'number' &&
          (v.size > 0 || group === 'restored')
        ) {
          details.push(formatBytes(v.size));
        }
        if (details.length) {
          li.append(
            el('span', 'jp-PauseReport-meta', ` ${details.join(', ')}`)
          );
        }
        if (v.reason) {
          li.append(el('span', 'jp-PauseReport-why', ` — ${v.reason}`));
        }
        if (v.cell?.execution_count != null && group === 'recomputable') {
          li.append(
            el(
              'span',
              'jp-PauseReport-meta',
              ' ' + trans.__('(cell [%1])', v.cell.execution_count)
            )
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
    const recomputable = list(
      trans.__('Can be recomputed'),
      groups.recomputable,
      'recomputable'
    );
    const path = kernel.path;
    if (recomputable && path) {
      const names = groups.recomputable.map(v => v.name);
      const button = el(
        'button',
        'jp-mod-styled jp-mod-accept jp-PauseReport-recompute'
      );
      button.textContent = trans.__('Recompute %1', names.join(', '));
      button.setAttribute(
        'aria-label',
        trans.__('Re-run the cells that made %1', names.join(', '))
      );
      button.disabled = this._running.has(path);
      button.addEventListener('click', () => void this._recompute(path, names));
      recomputable.append(button);
    }
    // Kept across re-renders (a status event re-renders the whole body).
    const result = path ? this._results.get(path) : undefined;
    if (path && (result || this._running.has(path))) {
      const p = el(
        'p',
        'jp-PauseReport-result',
        result ?? trans.__('Re-running the recorded cells…')
      );
      p.setAttribute('aria-live', 'polite');
      section.append(p);
    }
    list(trans.__('Skipped'), groups.skipped, 'skipped');
    list(trans.__('Failed'), groups.failed, 'failed');
    if (!(kernel.variables ?? []).length) {
      section.append(
        el('p', 'jp-PauseReport-empty', trans.__('No variables.'))
      );
    }
    const processState = kernel.process_state ?? [];
    if (processState.length) {
      section.append(
        this._fold(
          `process:${kernel.path ?? kernel.kernel_id}`,
          processStateOf(trans, processState)
        )
      );
    }
    return section;
  }
}

/** The kernel's process state (random generators, working directory, settings), folded: each
 * row with what happened to it and why. */
function processStateOf(
  trans: ITrans,
  rows: IReportVariable[]
): HTMLDetailsElement {
  const details = el('details', 'jp-PauseReport-process');
  const back = rows.filter(r => r.status === 'restored').length;
  details.append(
    el(
      'summary',
      undefined,
      trans.__('Process state: %1 of %2 put back', back, rows.length)
    )
  );
  const ul = el('ul');
  for (const r of rows) {
    const li = el('li');
    li.dataset.status = r.status;
    li.append(el('code', undefined, r.name));
    li.append(el('span', 'jp-PauseReport-meta', ` ${r.status}`));
    if (r.reason) {
      li.append(el('span', 'jp-PauseReport-why', ` — ${r.reason}`));
    }
    ul.append(li);
  }
  details.append(ul);
  return details;
}

/** A folded "Details" block of the non-empty lines. */
function detailsOf(trans: ITrans, facts: string[]): HTMLDetailsElement {
  const details = el('details', 'jp-PauseReport-details');
  details.append(el('summary', undefined, trans.__('Details')));
  for (const fact of facts.filter(f => !!f)) {
    details.append(el('p', 'jp-PauseReport-meta', fact));
  }
  return details;
}

/** Open the details / report dialog; `current`: the notebook the person is looking at. */
export async function showReportDialog(
  controller: PauseController,
  trans: ITrans,
  current: () => string | null = () => null
): Promise<void> {
  void controller.refresh();
  const body = new PauseReportBody(controller, trans, current);
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

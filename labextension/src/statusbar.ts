import { Widget } from '@lumino/widgets';

import { PauseController } from './controller';
import { ITrans } from './format';
import { headerLabel } from './status';

/**
 * Status bar item: always shows the workspace state. Focusable; Enter, Space or a click
 * opens the details (state, reason, what to do, last report).
 */
export class PauseStatusItem extends Widget {
  constructor(
    private _controller: PauseController,
    private _trans: ITrans,
    private _openDetails: () => void,
    /** In Notebook 7's header (no status bar): labels that do not say "checkpoint". */
    private _header = false
  ) {
    super();
    this.addClass('jp-PauseStatus');
    if (_header) {
      this.addClass('jp-PauseStatus-header');
    }
    const node = this.node;
    node.tabIndex = 0;
    node.setAttribute('role', 'button');
    this._dot = document.createElement('span');
    this._dot.className = 'jp-PauseStatus-dot';
    this._dot.setAttribute('aria-hidden', 'true');
    this._text = document.createElement('span');
    this._text.className = 'jp-PauseStatus-text';
    // Screen readers hear state changes without moving focus.
    this._text.setAttribute('aria-live', 'polite');
    this._bar = document.createElement('span');
    this._bar.className = 'jp-PauseStatus-progress';
    this._bar.setAttribute('aria-hidden', 'true');
    this._fill = document.createElement('span');
    this._fill.className = 'jp-PauseStatus-progressFill';
    this._bar.appendChild(this._fill);
    node.append(this._dot, this._text, this._bar);
    node.addEventListener('click', this);
    node.addEventListener('keydown', this);
    _controller.changed.connect(this._render, this);
    this._render();
  }

  handleEvent(event: Event): void {
    if (event.type === 'click') {
      this._openDetails();
    } else if (event.type === 'keydown') {
      const key = (event as KeyboardEvent).key;
      if (key === 'Enter' || key === ' ') {
        event.preventDefault();
        this._openDetails();
      }
    }
  }

  dispose(): void {
    this._controller.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const view = this._controller.statusView;
    const node = this.node;
    node.dataset.state = view.state;
    node.dataset.severity = view.severity;
    const label = this._header
      ? headerLabel(view, this._controller.status, this._trans)
      : view.label;
    this._text.textContent = label;
    node.title = view.tooltip;
    node.setAttribute(
      'aria-label',
      this._trans.__('Pause and resume: %1. Press Enter for details.', label)
    );
    if (view.progress !== null) {
      this._bar.style.display = '';
      this._fill.style.width = `${Math.round(view.progress * 100)}%`;
    } else {
      this._bar.style.display = 'none';
    }
  }

  private _dot: HTMLSpanElement;
  private _text: HTMLSpanElement;
  private _bar: HTMLSpanElement;
  private _fill: HTMLSpanElement;
}

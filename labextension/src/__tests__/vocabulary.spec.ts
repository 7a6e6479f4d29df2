import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { IStatus } from '../api';
import { describeStatus } from '../status';
import { WORKSPACE_STATES } from '../vocabulary';
import { trans } from './trans';

describe('every state of the server vocabulary', () => {
  it('has a status bar view in plain words, never the raw state name', () => {
    for (const state of WORKSPACE_STATES) {
      const view = describeStatus({ state } as IStatus, null, trans);
      assert.equal(
        view.state,
        state,
        `${state} is shown as a state this page does not know`
      );
      assert.notEqual(view.label, state, state);
      assert.doesNotMatch(view.label, /_/, state);
      assert.ok(view.tooltip.length > 0, state);
    }
  });

  it('says what a server stop does while it runs', () => {
    const view = describeStatus(
      {
        state: 'stopping',
        step: {
          name: 'stopping',
          message: 'Checkpointing the kernels before the server stops'
        }
      } as IStatus,
      null,
      trans
    );
    assert.equal(view.label, 'Server stopping: saving kernels');
    assert.equal(view.severity, 'busy');
    assert.match(view.tooltip, /saves the state of each kernel/);
    assert.match(
      view.tooltip,
      /Checkpointing the kernels before the server stops/
    );
  });
});

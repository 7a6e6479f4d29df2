import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { commandParts } from '../commandtext';

describe('commands in a reason', () => {
  it('splits out the install command the server writes between backticks', () => {
    const reason =
      "checkpoint of other.ipynb failed: jupyter-pause-kernel is not installed in this kernel's " +
      'environment (/envs/other/bin/python); install it there, then restart the kernel: ' +
      '`/envs/other/bin/python -m pip install jupyter-pause-kernel==0.1.0`';
    const parts = commandParts(reason);
    assert.deepEqual(
      parts.filter(p => p.command).map(p => p.text),
      ['/envs/other/bin/python -m pip install jupyter-pause-kernel==0.1.0']
    );
    assert.equal(parts.map(p => p.text).join(''), reason.replace(/`/g, ''));
    assert.equal(parts[0].command, false);
  });

  it('leaves text without a command whole, and an unpaired backtick as text', () => {
    assert.deepEqual(commandParts('the store is full'), [
      { text: 'the store is full', command: false }
    ]);
    assert.deepEqual(commandParts('a ` alone'), [
      { text: 'a ` alone', command: false }
    ]);
    assert.deepEqual(commandParts('run `a` then `b`.'), [
      { text: 'run ', command: false },
      { text: 'a', command: true },
      { text: ' then ', command: false },
      { text: 'b', command: true },
      { text: '.', command: false }
    ]);
  });
});

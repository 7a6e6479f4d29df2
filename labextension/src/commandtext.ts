/**
 * A reason or hint split into its plain text and the commands in it, which the server writes
 * between backticks (a kernel without jupyter-pause-kernel:
 * "`/envs/other/bin/python -m pip install jupyter-pause-kernel==0.1.0`"), so that the dialog can
 * show each command as code and copy it whole.
 */
export interface ITextPart {
  text: string;
  command: boolean;
}

export function commandParts(text: string): ITextPart[] {
  const parts: ITextPart[] = [];
  const quoted = /`([^`\n]+)`/g;
  let last = 0;
  for (let m = quoted.exec(text); m !== null; m = quoted.exec(text)) {
    if (m.index > last) {
      parts.push({ text: text.slice(last, m.index), command: false });
    }
    parts.push({ text: m[1], command: true });
    last = quoted.lastIndex;
  }
  if (last < text.length) {
    parts.push({ text: text.slice(last), command: false });
  }
  return parts;
}

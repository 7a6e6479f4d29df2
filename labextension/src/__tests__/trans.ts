import { ITrans } from '../format';

const fmt = (msg: string, args: any[]) =>
  msg.replace(/%(\d+)/g, (_, i) => String(args[Number(i) - 1]));

/** Same placeholder rules as JupyterLab's nullTranslator: %1, %2 ...; in _n, %1 is n. */
export const trans: ITrans = {
  __: (msg: string, ...args: any[]) => fmt(msg, args),
  _n: (one: string, many: string, n: number, ...args: any[]) =>
    fmt(n === 1 ? one : many, [n, ...args])
};

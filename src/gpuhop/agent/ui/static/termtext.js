// gpuhop dashboard: a job's log as a terminal would show it, as plain text. The same rules
// as gpuhop/cli/termtext.py (which `gpuhop logs` uses; read its docstring): a carriage
// return goes back to the line's start, a backspace one column left, and what follows
// overwrites; `ESC[K` erases, `ESC[nG`/`nD`/`nC` move the cursor, every other escape
// sequence (colours, titles) shows nothing. tests/e2e/test_dashboard_browser.py holds the
// two to one output for a real Keras progress-bar log.

const ESCAPE = /\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])/g;
const UNFINISHED = /\x1b(\[[0-?]*[ -/]*|\][^\x07\x1b]*\x1b?)?$/;
const INVISIBLE = /[\x00-\x07\x0b\x0c\x0e-\x1f\x7f]/g;

export function renderTerminal(text) {
  const out = [];
  let line = [];
  let cursor = 0;
  const write = (part) => {
    for (const char of part.replace(INVISIBLE, "")) {
      if (char === "\n") {
        out.push(line.join("").trimEnd());
        line = [];
        cursor = 0;
      } else if (char === "\r") {
        cursor = 0;
      } else if (char === "\b") {
        cursor = Math.max(0, cursor - 1);
      } else {
        while (line.length < cursor) line.push(" ");
        line[cursor] = char;
        cursor += 1;
      }
    }
  };
  const escape = (body) => {
    if (!body.startsWith("[")) return;
    const command = body.slice(-1);
    const argument = body.slice(1, -1);
    const count = /^\d+$/.test(argument) ? Number(argument) : 1;
    if (command === "K" && ["", "0", "1", "2"].includes(argument)) {
      if (argument === "" || argument === "0") line.length = Math.min(line.length, cursor);
      else {
        const end = argument === "2" ? line.length : Math.min(cursor, line.length);
        for (let i = 0; i < end; i += 1) line[i] = " ";
      }
    } else if (command === "G") cursor = Math.max(0, count - 1);
    else if (command === "D") cursor = Math.max(0, cursor - count);
    else if (command === "C") cursor += count;
  };
  const cut = text.match(UNFINISHED);
  const whole = cut ? text.slice(0, cut.index) : text;
  let position = 0;
  for (const match of whole.matchAll(ESCAPE)) {
    write(whole.slice(position, match.index));
    escape(match[1]);
    position = match.index + match[0].length;
  }
  write(whole.slice(position));
  out.push(line.join("").trimEnd());
  return out.join("\n");
}

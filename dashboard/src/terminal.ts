// A terminal in the browser: xterm.js over the agent's PTY API (process.Process/Start with a
// pty, SendInput, Update), through the e2b SDK.

import '@xterm/xterm/css/xterm.css'
import { Terminal } from '@xterm/xterm'
import { FitAddon } from '@xterm/addon-fit'
import type { Sandbox } from 'e2b'
import { errorText, h, notice } from './ui'

export function openTerminal(box: HTMLElement, sbx: Sandbox): () => void {
  const screen = h('div', { class: 'terminal', id: 'terminal' })
  const status = h('div', { id: 'terminal-status' })
  box.replaceChildren(status, screen)
  const term = new Terminal({
    cursorBlink: true,
    fontFamily: 'monospace',
    fontSize: 14,
    convertEol: false,
  })
  const fit = new FitAddon()
  term.loadAddon(fit)
  term.open(screen)
  fit.fit()
  const encoder = new TextEncoder()
  let pid: number | undefined
  let closed = false
  const onResize = () => fit.fit()
  window.addEventListener('resize', onResize)

  sbx.pty
    .create({
      cols: term.cols,
      rows: term.rows,
      timeoutMs: 0,
      onData: (data) => term.write(data),
    })
    .then(async (handle) => {
      pid = handle.pid
      if (closed) {
        await sbx.pty.kill(handle.pid)
        return
      }
      status.replaceChildren(notice(`terminal open (pid ${handle.pid})`))
      screen.dataset.ready = 'true'
      term.focus()
      try {
        const result = await handle.wait()
        if (!closed) status.replaceChildren(notice(`terminal ended (exit ${result.exitCode})`))
      } catch (e) {
        if (!closed) status.replaceChildren(notice(`terminal ended: ${errorText(e)}`))
      }
    })
    .catch((e) => status.replaceChildren(notice(`terminal: ${errorText(e)}`, true)))

  // Keystrokes go out one request at a time, in order (concurrent requests could arrive out
  // of order); what is typed meanwhile is sent together in the next one.
  let pending = ''
  let sending = false
  const flush = async () => {
    sending = true
    while (pending && pid !== undefined && !closed) {
      const chunk = pending
      pending = ''
      try {
        await sbx.pty.sendInput(pid, encoder.encode(chunk))
      } catch (e) {
        status.replaceChildren(notice(`input: ${errorText(e)}`, true))
      }
    }
    sending = false
  }
  term.onData((text) => {
    if (pid === undefined) return
    pending += text
    if (!sending) void flush()
  })
  term.onResize(({ cols, rows }) => {
    if (pid !== undefined) sbx.pty.resize(pid, { cols, rows }).catch(() => undefined)
  })

  return () => {
    closed = true
    window.removeEventListener('resize', onResize)
    if (pid !== undefined) sbx.pty.kill(pid).catch(() => undefined)
    term.dispose()
  }
}

// Starts and stops a `warren serve` for the JS SDK suites (tests/e2e/js, tests/interpreter/js):
// a free loopback port, the given data dir and API key, its log appended to <dataDir>/<logName>.
// Only node's own modules: each suite's package installs the SDK it tests, nothing of this.

import { spawn } from 'node:child_process'
import { closeSync, mkdirSync, openSync } from 'node:fs'
import { createServer } from 'node:net'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'

// The first start may build the base template image before listening (minutes).
const HEALTH_DEADLINE_MS = 900_000

export function freePort() {
  return new Promise((ok, fail) => {
    const srv = createServer()
    srv.once('error', fail)
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address()
      srv.close(() => ok(port))
    })
  })
}

// Resolves to { proc, url, logPath } once /health answers 200; throws with the log's path if the
// server exits first or is not healthy within the deadline.
export async function startServer({ bin, dataDir, apiKey, logName }) {
  mkdirSync(dataDir, { recursive: true })
  const port = await freePort()
  const url = `http://127.0.0.1:${port}`
  const logPath = join(dataDir, logName)
  const logFd = openSync(logPath, 'a')
  const proc = spawn(
    bin,
    ['serve', '--listen', `127.0.0.1:${port}`, '--data-dir', dataDir, '--runtime', 'auto'],
    { env: { ...process.env, WARREN_API_KEY: apiKey, WARREN_LOG: 'info' }, stdio: ['ignore', logFd, logFd] },
  )
  closeSync(logFd)
  let exited = null
  proc.on('exit', (code, signal) => { exited = { code, signal } })
  proc.on('error', (err) => { exited = { code: null, signal: null, err } })
  const server = { proc, url, logPath }
  const deadline = Date.now() + HEALTH_DEADLINE_MS
  while (Date.now() < deadline) {
    if (exited) {
      throw new Error(`warren serve exited (${exited.err ?? `code ${exited.code}, signal ${exited.signal}`}); see ${logPath}`)
    }
    try {
      const res = await fetch(`${url}/health`, { signal: AbortSignal.timeout(1000) })
      if (res.status === 200) return server
    } catch {}
    await sleep(100)
  }
  await stopServer(server)
  throw new Error(`warren serve did not become healthy; see ${logPath}`)
}

// SIGTERM, then SIGKILL after 30 s; resolves once the server has exited.
export async function stopServer({ proc }) {
  if (proc.exitCode !== null || proc.signalCode !== null) return
  const exited = new Promise((ok) => proc.once('exit', ok))
  process.kill(proc.pid, 'SIGTERM')
  const timer = setTimeout(() => { try { process.kill(proc.pid, 'SIGKILL') } catch {} }, 30_000)
  await exited
  clearTimeout(timer)
}

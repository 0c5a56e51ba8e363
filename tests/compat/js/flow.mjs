// The JS half of the SDK version matrix: one flow (create with env vars and metadata, commands,
// a background command, files, a terminal, list, pause, connect, setTimeout, kill) written
// against the calls each `e2b` JS release has, run by tests/e2e/test_js_sdk_matrix.py with
// the release installed in WARREN_COMPAT_JS_SDK_DIR (a directory holding node_modules/e2b).
// Prints one JSON object with what it saw; the Python side asserts on it.

import { createRequire } from 'node:module'
import { join } from 'node:path'

const dir = process.env.WARREN_COMPAT_JS_SDK_DIR
const require = createRequire(join(dir, 'package.json'))
const { Sandbox } = require('e2b')
const version = require('e2b/package.json').version

async function listedIds() {
  const listed = await Sandbox.list()
  const items = Array.isArray(listed) ? listed : await listed.nextItems()
  return items.map((s) => s.sandboxId)
}

const seen = { version }
const sbx = await Sandbox.create({
  timeoutMs: 120_000,
  metadata: { matrix: 'js' },
  envs: { MATRIX_VAR: 'from-create' },
})
try {
  seen.id = sbx.sandboxId
  seen.host = sbx.getHost(8000)
  seen.env = (await sbx.commands.run('echo $MATRIX_VAR')).stdout
  const bg = await sbx.commands.run('sleep 30', { background: true })
  seen.bgPid = bg.pid
  seen.bgKilled = await bg.kill()
  await sbx.files.write('/home/user/kept.txt', 'kept across pause')
  seen.read = await sbx.files.read('/home/user/kept.txt')
  seen.listedFiles = (await sbx.files.list('/home/user')).map((e) => e.name)

  let out = ''
  const decoder = new TextDecoder()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += decoder.decode(d) } })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo pty-$((6*7)); exit\n'))
  await term.wait()
  seen.pty = out

  seen.listed = (await listedIds()).includes(sbx.sandboxId)
  seen.metadata = (await sbx.getInfo()).metadata

  // Paused and resumed where the release can (2.x); 1.x reconnects instead.
  const pause = sbx.pause ?? sbx.betaPause
  seen.paused = typeof pause === 'function'
  if (seen.paused) await pause.call(sbx)
  const again = await Sandbox.connect(sbx.sandboxId)
  seen.afterResume = await again.files.read('/home/user/kept.txt')
  seen.resumedRun = (await again.commands.run('echo resumed')).stdout
  await again.setTimeout(60_000)
} finally {
  await sbx.kill()
}
seen.listedAfterKill = (await listedIds()).includes(seen.id)
console.log(JSON.stringify(seen))

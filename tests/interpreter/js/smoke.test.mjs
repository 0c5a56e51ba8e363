// Smoke test of the code interpreter with the official, unmodified E2B code-interpreter JS SDK
// (@e2b/code-interpreter@2.8.0) against `warren serve` (namespace runtime, needs root).
// Run: `npm ci && node --test`. The code-interpreter-v1 image must be built already (the Python
// suite or `warren template build code-interpreter-v1` does that).
//
// WARREN_BIN: the `warren` binary (default ../../../target/release/warren from this file).
// WARREN_E2E_DATA_DIR: data dir (default /var/lib/warren, which keeps the built images).

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { dirname, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { startServer as startWarren, stopServer } from '../../support/serve.mjs'

const HERE = dirname(fileURLToPath(import.meta.url))
const WARREN_BIN = process.env.WARREN_BIN || resolve(HERE, '../../../target/release/warren')
const DATA_DIR = process.env.WARREN_E2E_DATA_DIR || '/var/lib/warren'
const API_KEY = 'e2b_0f1e2d3c4b5a69788796a5b4c3d2e1f001234567' // E2B's key format

function startServer() {
  return startWarren({ bin: WARREN_BIN, dataDir: DATA_DIR, apiKey: API_KEY, logName: 'serve-js-interp.log' })
}

test('the JS code-interpreter SDK runs code in a code-interpreter-v1 sandbox', { timeout: 600_000 }, async () => {
  const server = await startServer()
  try {
    process.env.E2B_API_KEY = API_KEY
    process.env.E2B_API_URL = server.url
    process.env.E2B_SANDBOX_URL = server.url
    const { Sandbox } = await import('@e2b/code-interpreter')
    // No template: the SDK's default alias is code-interpreter-v1.
    const sbx = await Sandbox.create({ timeoutMs: 300_000, requestTimeoutMs: 300_000 })
    try {
      await sbx.runCode('x = 41')
      const sum = await sbx.runCode('x + 1')
      assert.equal(sum.text, '42')

      const out = []
      const printed = await sbx.runCode('print("hello")', { onStdout: (m) => out.push(m.line) })
      assert.deepEqual(printed.logs.stdout, ['hello\n'])
      assert.deepEqual(out, ['hello\n'])

      const plot = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4])\nplt.show()')
      const png = Buffer.from(plot.results[0].png, 'base64')
      assert.deepEqual([...png.subarray(1, 4)], [...Buffer.from('PNG')])
      assert.equal(plot.results[0].chart.type, 'line')

      const failed = await sbx.runCode('1 / 0')
      assert.equal(failed.error.name, 'ZeroDivisionError')

      const bash = await sbx.runCode('echo "$((6 * 7))"', { language: 'bash' })
      assert.deepEqual(bash.logs.stdout, ['42\n'])

      const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
      const cwd = await sbx.runCode('import os; os.getcwd()', { context: ctx })
      assert.equal(cwd.text, '/tmp')

      await assert.rejects(sbx.runCode('import time; time.sleep(600)', { timeoutMs: 3_000 }))
      const after = await sbx.runCode('x', { timeoutMs: 120_000 })
      assert.equal(after.text, '41')
    } finally {
      await sbx.kill()
    }
  } finally {
    await stopServer(server)
  }
})

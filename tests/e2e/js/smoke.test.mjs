// Control-plane smoke test with the official, unmodified E2B JS SDK (e2b@2.51.0) against
// `warren serve` (namespace runtime, needs root). Run: `npm ci && node --test`.
//
// WARREN_BIN: the `warren` binary (default ../../../target/release/warren from this file).
// WARREN_E2E_DATA_DIR: data dir (default /var/lib/warren, which keeps the built base image).

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { startServer as startWarren, stopServer } from '../../support/serve.mjs'

const HERE = dirname(fileURLToPath(import.meta.url))
const WARREN_BIN = process.env.WARREN_BIN || resolve(HERE, '../../../target/release/warren')
const DATA_DIR = process.env.WARREN_E2E_DATA_DIR || '/var/lib/warren'
const API_KEY = 'e2b_a1b2c3d4e5f60718293a4b5c6d7e8f9012345678' // E2B's key format

function startServer() {
  return startWarren({ bin: WARREN_BIN, dataDir: DATA_DIR, apiKey: API_KEY, logName: 'serve-js.log' })
}

async function listIds(Sandbox, opts) {
  const ids = []
  const paginator = Sandbox.list(opts)
  while (paginator.hasNext) {
    for (const info of await paginator.nextItems()) ids.push(info.sandboxId)
  }
  return ids
}

test('E2B JS SDK smoke against warren serve', { timeout: 1_200_000 }, async (t) => {
  if (typeof process.geteuid === 'function' && process.geteuid() !== 0) {
    console.log('skipping: the namespace runtime of warren serve needs root')
    t.skip('the namespace runtime of warren serve needs root')
    return
  }

  const server = await startServer()
  const created = []
  try {
    process.env.E2B_API_KEY = API_KEY
    process.env.E2B_API_URL = server.url
    process.env.E2B_SANDBOX_URL = server.url
    const { Sandbox, CommandExitError, AuthenticationError } = await import('e2b')

    // The first create may build the base template image (minutes).
    const sbx = await Sandbox.create({ timeoutMs: 120_000, requestTimeoutMs: 900_000 })
    created.push(sbx)
    assert.match(sbx.sandboxId, /^[a-z0-9]+$/)

    await t.test('commands.run echo', async () => {
      const r = await sbx.commands.run('echo hello')
      assert.equal(r.exitCode, 0)
      assert.equal(r.stdout, 'hello\n')
      assert.equal(r.stderr, '')
    })

    await t.test('non-zero exit rejects with CommandExitError', async () => {
      await assert.rejects(sbx.commands.run('echo oops >&2; exit 3'), (err) => {
        assert.ok(err instanceof CommandExitError, `got ${err?.constructor?.name}: ${err}`)
        assert.equal(err.exitCode, 3)
        assert.equal(err.stderr, 'oops\n')
        return true
      })
    })

    await t.test('files write/read/list', async () => {
      const text = 'hello from the JS SDK\nsecond line ✓\n'
      const info = await sbx.files.write('/tmp/js-smoke/hello.txt', text)
      assert.equal(info.path, '/tmp/js-smoke/hello.txt')
      assert.equal(await sbx.files.read('/tmp/js-smoke/hello.txt'), text)
      const entries = await sbx.files.list('/tmp/js-smoke')
      const entry = entries.find((e) => e.name === 'hello.txt')
      assert.ok(entry, `hello.txt not in ${JSON.stringify(entries.map((e) => e.name))}`)
      assert.equal(entry.type, 'file')
      assert.equal(entry.path, '/tmp/js-smoke/hello.txt')
      const r = await sbx.commands.run('cat /tmp/js-smoke/hello.txt')
      assert.equal(r.stdout, text)
    })

    await t.test('background command + commands.kill', async () => {
      const handle = await sbx.commands.run('sleep 600', { background: true })
      assert.ok(handle.pid > 0)
      const running = await sbx.commands.list()
      assert.ok(running.some((p) => p.pid === handle.pid), 'background pid not in commands.list()')
      assert.equal(await sbx.commands.kill(handle.pid), true)
      await assert.rejects(handle.wait(), (err) => {
        assert.ok(err instanceof CommandExitError, `got ${err?.constructor?.name}: ${err}`)
        assert.notEqual(err.exitCode, 0)
        return true
      })
      const after = await sbx.commands.list()
      assert.ok(!after.some((p) => p.pid === handle.pid), 'killed pid still in commands.list()')
    })

    await t.test('pause, resume, snapshot, fork', async () => {
      const p = await Sandbox.create({ timeoutMs: 120_000 })
      created.push(p)
      await p.files.write('/home/user/kept.txt', 'kept by pause')
      assert.equal(await p.pause(), true)
      assert.equal(await Sandbox.pause(p.sandboxId), false, 'already paused')
      const back = await Sandbox.connect(p.sandboxId)
      assert.equal(await back.files.read('/home/user/kept.txt'), 'kept by pause')

      const snap = await back.createSnapshot({ name: `js-smoke-${process.pid}` })
      assert.deepEqual(snap.names, [`js-smoke-${process.pid}`])
      const fromSnap = await Sandbox.create(snap.snapshotId, { timeoutMs: 60_000 })
      created.push(fromSnap)
      assert.equal(await fromSnap.files.read('/home/user/kept.txt'), 'kept by pause')
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)

      const forks = await back.fork({ count: 2, timeoutMs: 60_000 })
      assert.equal(forks.length, 2)
      for (const f of forks) {
        assert.ok(!(f instanceof Error), `fork failed: ${f}`)
        created.push(f)
        assert.equal(await f.files.read('/home/user/kept.txt'), 'kept by pause')
      }
    })

    await t.test('template builder: COPY, RUN, ENV, WORKDIR, start/ready, tags, fromDockerfile', async () => {
      const { Template, waitForPort } = await import('e2b')
      const dir = mkdtempSync(join(tmpdir(), 'warren-js-tpl-'))
      writeFileSync(join(dir, 'app.txt'), 'from the JS SDK\n')
      const stamp = `${process.pid}-${Date.now()}`
      const name = `js-tpl-${stamp}`
      const tpl = Template({ fileContextPath: dir })
        .fromBaseImage()
        .copy('app.txt', '/opt/app/app.txt')
        .runCmd(`echo ${stamp} > /opt/app/stamp`, { user: 'root' })
        .setEnvs({ GREETING: 'hi' })
        .setWorkdir('/opt/app')
        .setStartCmd('python3 -m http.server 8080', waitForPort(8080))
      const logs = []
      const info = await Template.build(tpl, name, { onBuildLogs: (l) => logs.push(String(l.message ?? l)) })
      assert.ok(info.templateId && info.buildId, JSON.stringify(info))
      assert.equal(await Template.exists(name), true)
      const s = await Sandbox.create(name, { timeoutMs: 60_000 })
      created.push(s)
      assert.equal((await s.commands.run('cat /opt/app/app.txt')).stdout, 'from the JS SDK\n')
      assert.equal((await s.commands.run('cat stamp')).stdout, `${stamp}\n`)
      assert.equal((await s.commands.run('pwd')).stdout, '/opt/app\n')
      // The start command is ready before the create returns.
      const code = await s.commands.run('curl -s -o /dev/null -w "%{http_code}" http://127.0.0.1:8080/app.txt')
      assert.equal(code.stdout, '200')
      const tagged = await Template.assignTags(`${name}:default`, ['js'])
      assert.deepEqual(tagged.tags, ['js'])
      const tags = (await Template.getTags(info.templateId)).map((x) => x.tag).sort()
      assert.deepEqual(tags, ['default', 'js'])

      // A Dockerfile, parsed by the SDK into the same steps.
      const df = Template({ fileContextPath: dir }).fromDockerfile(
        `FROM e2bdev/base\nCOPY app.txt /srv/app.txt\nRUN echo ${stamp} > /tmp/df\nENV MODE=docker\nWORKDIR /srv\n`,
      )
      await Template.build(df, `${name}-df`)
      const d = await Sandbox.create(`${name}-df`, { timeoutMs: 60_000 })
      created.push(d)
      assert.equal((await d.commands.run('cat /srv/app.txt /tmp/df')).stdout, `from the JS SDK\n${stamp}\n`)
      assert.equal((await d.commands.run('pwd')).stdout, '/srv\n')
    })

    await t.test('list, kill, list', async () => {
      assert.ok((await listIds(Sandbox)).includes(sbx.sandboxId), 'sandbox missing from Sandbox.list()')
      await sbx.kill()
      created.splice(created.indexOf(sbx), 1)
      assert.ok(!(await listIds(Sandbox)).includes(sbx.sandboxId), 'killed sandbox still in Sandbox.list()')
      assert.equal(await sbx.isRunning(), false)
    })

    await t.test('wrong API key rejects with AuthenticationError', async () => {
      await assert.rejects(listIds(Sandbox, { apiKey: 'wrong-key-0123456789' }), (err) => {
        assert.ok(err instanceof AuthenticationError, `got ${err?.constructor?.name}: ${err}`)
        return true
      })
      await assert.rejects(Sandbox.create({ apiKey: 'wrong-key-0123456789' }), AuthenticationError)
    })
  } finally {
    for (const s of created) {
      try { await s.kill() } catch (err) { console.error(`killing ${s.sandboxId}: ${err}`) }
    }
    await stopServer(server)
  }
})

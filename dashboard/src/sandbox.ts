// One sandbox: its details, pause/resume/kill, live CPU and memory charts, processes, a
// terminal, files, and the logs, events and audit trail where the server offers them.

import type { Sandbox as SdkSandbox } from 'e2b'
import { api, ApiError, enc, Metric, Sandbox } from './api'
import { kill, pause, resume } from './actions'
import { MetricsCharts } from './charts'
import { connectSandbox } from './envd'
import { openFiles } from './files'
import { openTerminal } from './terminal'
import { errorText, h, notice, when } from './ui'

const TABS = ['Metrics', 'Processes', 'Terminal', 'Files', 'Logs', 'Events', 'Audit'] as const
type Tab = (typeof TABS)[number]

/** Where the server may offer a sandbox's logs, events and audit trail; 404 = not offered. */
const RECORDS: Record<string, string[]> = {
  Logs: ['/v2/sandboxes/{id}/logs', '/sandboxes/{id}/logs'],
  Events: ['/events/sandboxes/{id}', '/v1/sandboxes/{id}/events'],
  Audit: ['/v1/sandboxes/{id}/audit', '/sandboxes/{id}/audit'],
}

/** Logs, events or audit entries: a table of time, kind and details where the answer is a
 * list (or an object holding one list), else the JSON as it came. */
function records(data: unknown): HTMLElement {
  let rows: unknown[] | undefined = Array.isArray(data) ? data : undefined
  if (!rows && data && typeof data === 'object') {
    const lists = Object.values(data).filter(Array.isArray)
    if (lists.length === 1) rows = lists[0]
  }
  if (!rows) return h('pre', { class: 'records', id: 'records' }, JSON.stringify(data, null, 2))
  if (!rows.length) return notice('Nothing recorded yet.')
  const text = (v: unknown) => (v === undefined || v === null ? '' : typeof v === 'string' ? v : JSON.stringify(v))
  return h(
    'table',
    { id: 'records' },
    h('thead', {}, h('tr', {}, h('th', {}, 'time'), h('th', {}, 'what'), h('th', {}, 'details'))),
    h(
      'tbody',
      {},
      ...rows.map((r) => {
        const o = (r && typeof r === 'object' ? r : { message: r }) as Record<string, unknown>
        return h(
          'tr',
          {},
          h('td', {}, when(text(o.timestamp ?? o.time))),
          h('td', {}, text(o.type ?? o.kind ?? o.level ?? o.action)),
          h('td', { class: 'mono' }, text(o.message ?? o.line ?? o.eventData ?? o.fields)),
        )
      }),
    ),
  )
}

export function renderSandbox(main: HTMLElement, id: string, onAuthError: () => void): () => void {
  let info: Sandbox | undefined
  let sdk: Promise<SdkSandbox> | undefined
  let tab: Tab = 'Metrics'
  let closeTab: (() => void) | undefined
  let stopped = false
  let timer: number | undefined

  const title = h('h2', {}, `Sandbox ${id}`)
  const details = h('dl', { class: 'details', id: 'details' })
  const status = h('div', { id: 'sandbox-status' })
  const actions = h('div', { class: 'actions', id: 'sandbox-actions' })
  const tabs = h('nav', { class: 'tabs' })
  const panel = h('section', { class: 'panel', id: 'panel' })

  function fail(e: unknown): void {
    if (e instanceof ApiError && e.status === 401) onAuthError()
    else status.replaceChildren(notice(errorText(e), true))
  }

  /** The SDK's connection, made once while the sandbox runs (a paused one is not resumed). */
  function envd(): Promise<SdkSandbox> {
    if (info?.state !== 'running') return Promise.reject(new Error('the sandbox is not running'))
    sdk ??= connectSandbox(id).catch((e) => {
      sdk = undefined
      throw e
    })
    return sdk
  }

  async function load(): Promise<void> {
    window.clearTimeout(timer)
    try {
      const next = await api<Sandbox>('GET', `/sandboxes/${enc(id)}`)
      if (stopped) return
      const changed = info?.state !== next.state
      info = next
      if (next.state !== 'running') sdk = undefined
      showDetails()
      if (changed) {
        showActions()
        showTab(tab)
      }
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) {
        status.replaceChildren(notice('This sandbox no longer exists.', true))
        actions.replaceChildren()
        closeTab?.()
        closeTab = undefined
        panel.replaceChildren()
        return
      }
      fail(e)
    }
    if (!stopped) timer = window.setTimeout(load, 5000)
  }

  function showDetails(): void {
    if (!info) return
    const item = (k: string, v: string) => [h('dt', {}, k), h('dd', {}, v)]
    const meta = Object.entries(info.metadata ?? {}).map(([k, v]) => `${k}=${v}`)
    details.replaceChildren(
      ...item('state', info.pauseMode ? `${info.state} (${info.pauseMode})` : info.state),
      ...item('template', info.alias || info.templateID),
      ...item('resources', `${info.cpuCount} vCPU, ${info.memoryMB} MB, ${info.diskSizeMB} MB disk`),
      ...item('runtime', info.runtime?.name ?? ''),
      ...item('started', when(info.startedAt)),
      ...item('ends', info.state === 'paused' ? 'never while paused' : when(info.endAt)),
      ...item('metadata', meta.join(', ') || 'none'),
    )
    details.dataset.state = info.state
  }

  function act(text: string, cls: string, run: () => Promise<void>): HTMLButtonElement {
    const b = h('button', { type: 'button', class: cls, id: `action-${text.toLowerCase()}` }, text)
    b.addEventListener('click', async () => {
      actions.querySelectorAll('button').forEach((x) => (x.disabled = true))
      status.replaceChildren(notice(`${text}…`))
      try {
        await run()
        status.replaceChildren(notice(`${text}: done`))
      } catch (e) {
        fail(e)
      }
      await load()
      actions.querySelectorAll('button').forEach((x) => (x.disabled = false))
    })
    return b
  }

  function showActions(): void {
    actions.replaceChildren()
    if (info?.state === 'running') actions.append(act('Pause', '', () => pause(id)))
    if (info?.state === 'paused') actions.append(act('Resume', '', () => resume(id)))
    actions.append(
      act('Kill', 'danger', async () => {
        if (confirm(`Kill sandbox ${id}? Its files are lost.`)) await kill(id)
      }),
    )
  }

  function showTab(next: Tab): void {
    closeTab?.()
    closeTab = undefined
    tab = next
    tabs.replaceChildren(
      ...TABS.map((t) => {
        const b = h('button', { type: 'button', class: t === tab ? 'tab active' : 'tab' }, t)
        b.dataset.tab = t
        b.addEventListener('click', () => showTab(t))
        return b
      }),
    )
    panel.replaceChildren()
    panel.dataset.tab = tab
    if (tab === 'Metrics') closeTab = showMetrics()
    else if (tab in RECORDS) void showRecords(tab)
    else if (info?.state !== 'running') {
      panel.append(notice(`The sandbox is ${info?.state ?? 'not running'}: resume it to use ${tab.toLowerCase()}.`))
    } else {
      panel.append(notice(`connecting to the sandbox…`))
      let cancelled = false
      closeTab = () => {
        cancelled = true
      }
      envd()
        .then((sbx) => {
          if (cancelled || stopped) return
          if (tab === 'Terminal') closeTab = openTerminal(panel, sbx)
          else if (tab === 'Files') openFiles(panel, sbx)
          else closeTab = showProcesses(sbx)
        })
        .catch((e) => !cancelled && panel.replaceChildren(notice(errorText(e), true)))
    }
  }

  function showMetrics(): () => void {
    const charts = new MetricsCharts(panel)
    let t: number | undefined
    let done = false
    const poll = async () => {
      try {
        const points = await api<Metric[]>('GET', `/sandboxes/${enc(id)}/metrics`)
        if (done) return
        charts.add(points)
      } catch (e) {
        if (done) return
        charts.message(
          e instanceof ApiError && e.status === 409
            ? 'No metrics while the sandbox is not running.'
            : `metrics: ${errorText(e)}`,
        )
      }
      if (!done) t = window.setTimeout(poll, 3000)
    }
    void poll()
    return () => {
      done = true
      window.clearTimeout(t)
      charts.destroy()
    }
  }

  function showProcesses(sbx: SdkSandbox): () => void {
    const body = h('tbody', {})
    const note = h('div', {})
    panel.replaceChildren(
      note,
      h(
        'table',
        { id: 'processes' },
        h('thead', {}, h('tr', {}, ...['pid', 'command', 'tag', 'cwd'].map((t) => h('th', {}, t)))),
        body,
      ),
    )
    let t: number | undefined
    let done = false
    const poll = async () => {
      try {
        const list = await sbx.commands.list()
        if (done) return
        body.replaceChildren(
          ...list.map((p) =>
            h(
              'tr',
              {},
              h('td', {}, String(p.pid)),
              h('td', { class: 'mono' }, [p.cmd, ...p.args].join(' ')),
              h('td', {}, p.tag ?? ''),
              h('td', {}, p.cwd ?? ''),
            ),
          ),
        )
        note.replaceChildren(notice(`${list.length} process(es) started through the API`))
      } catch (e) {
        if (!done) note.replaceChildren(notice(errorText(e), true))
      }
      if (!done) t = window.setTimeout(poll, 3000)
    }
    void poll()
    return () => {
      done = true
      window.clearTimeout(t)
    }
  }

  async function showRecords(which: string): Promise<void> {
    for (const pattern of RECORDS[which]) {
      const path = pattern.replace('{id}', enc(id))
      try {
        const data = await api<unknown>('GET', path)
        if (tab !== which) return
        panel.replaceChildren(records(data))
        return
      } catch (e) {
        if (e instanceof ApiError && (e.status === 404 || e.status === 405)) continue
        if (tab === which) panel.replaceChildren(notice(errorText(e), true))
        return
      }
    }
    if (tab === which) panel.replaceChildren(notice(`${which}: not available on this server yet.`))
  }

  main.replaceChildren(
    h('p', {}, h('a', { href: '#/sandboxes' }, '← all sandboxes')),
    title,
    details,
    actions,
    status,
    tabs,
    panel,
  )
  void load()
  return () => {
    stopped = true
    window.clearTimeout(timer)
    closeTab?.()
  }
}

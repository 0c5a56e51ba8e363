// The sandbox list (GET /v2/sandboxes) with the API's own filters: state, template, metadata.

import { api, ApiError, Sandbox } from './api'
import { kill, pause, resume } from './actions'
import { errorText, h, notice, when } from './ui'

const FILTERS = 'warren.filters'

interface Filters {
  running: boolean
  paused: boolean
  template: string
  metadata: string
}

function savedFilters(): Filters {
  try {
    const f = JSON.parse(sessionStorage.getItem(FILTERS) ?? '') as Filters
    if (typeof f.running === 'boolean') return f
  } catch {
    // none saved
  }
  return { running: true, paused: true, template: '', metadata: '' }
}

/** `k=v, k2=v2` as typed becomes the API's `k=v&k2=v2` (each part URL-encoded). */
function metadataQuery(text: string): string {
  return text
    .split(/[,&]/)
    .map((p) => p.trim())
    .filter(Boolean)
    .map((p) => {
      const i = p.indexOf('=')
      const k = i < 0 ? p : p.slice(0, i)
      const v = i < 0 ? '' : p.slice(i + 1)
      return `${encodeURIComponent(k.trim())}=${encodeURIComponent(v.trim())}`
    })
    .join('&')
}

export function renderSandboxes(main: HTMLElement, onAuthError: () => void): () => void {
  const f = savedFilters()
  const running = h('input', { type: 'checkbox', id: 'filter-running', checked: f.running })
  const paused = h('input', { type: 'checkbox', id: 'filter-paused', checked: f.paused })
  const template = h('input', { id: 'filter-template', placeholder: 'template', value: f.template })
  const metadata = h('input', {
    id: 'filter-metadata',
    placeholder: 'metadata: key=value, key2=value2',
    value: f.metadata,
  })
  const status = h('div', { id: 'list-status' })
  const body = h('tbody', {})
  const form = h(
    'form',
    { class: 'filters', id: 'filters' },
    h('label', {}, running, ' running'),
    h('label', {}, paused, ' paused'),
    template,
    metadata,
    h('button', { type: 'submit' }, 'Filter'),
  )
  let stopped = false
  let timer: number | undefined

  async function refresh(): Promise<void> {
    window.clearTimeout(timer)
    const filters: Filters = {
      running: running.checked,
      paused: paused.checked,
      template: template.value.trim(),
      metadata: metadata.value.trim(),
    }
    sessionStorage.setItem(FILTERS, JSON.stringify(filters))
    const q = new URLSearchParams()
    const states = [filters.running && 'running', filters.paused && 'paused'].filter(Boolean)
    q.set('state', states.length ? states.join(',') : 'running,paused')
    if (filters.template) q.set('template', filters.template)
    if (filters.metadata) q.set('metadata', metadataQuery(filters.metadata))
    try {
      const list = await api<Sandbox[]>('GET', `/v2/sandboxes?${q}`)
      if (stopped) return
      body.replaceChildren(...list.map((s) => row(s)))
      status.replaceChildren(
        list.length ? notice(`${list.length} sandbox(es)`) : notice('No sandboxes match.'),
      )
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) return onAuthError()
      status.replaceChildren(notice(errorText(e), true))
    }
    if (!stopped) timer = window.setTimeout(refresh, 5000)
  }

  function button(text: string, cls: string, run: () => Promise<void>): HTMLButtonElement {
    const b = h('button', { type: 'button', class: cls }, text)
    b.addEventListener('click', async () => {
      b.disabled = true
      status.replaceChildren(notice(`${text}…`))
      try {
        await run()
        status.replaceChildren(notice(`${text}: done`))
      } catch (e) {
        status.replaceChildren(notice(`${text}: ${errorText(e)}`, true))
      }
      await refresh()
    })
    return b
  }

  function row(s: Sandbox): HTMLTableRowElement {
    const meta = Object.entries(s.metadata ?? {})
      .map(([k, v]) => `${k}=${v}`)
      .join(', ')
    const actions = h('td', { class: 'actions' })
    if (s.state === 'running') actions.append(button('Pause', 'pause', () => pause(s.sandboxID)))
    if (s.state === 'paused') actions.append(button('Resume', 'resume', () => resume(s.sandboxID)))
    actions.append(
      button('Kill', 'danger kill', async () => {
        if (confirm(`Kill sandbox ${s.sandboxID}? Its files are lost.`)) await kill(s.sandboxID)
      }),
    )
    return h(
      'tr',
      { 'data-sandbox': s.sandboxID, 'data-state': s.state },
      h('td', {}, h('a', { href: `#/sandboxes/${encodeURIComponent(s.sandboxID)}` }, s.sandboxID)),
      h('td', {}, s.alias || s.templateID),
      h('td', { class: `state ${s.state}` }, s.state),
      h('td', {}, `${s.cpuCount} vCPU, ${s.memoryMB} MB`),
      h('td', {}, when(s.startedAt)),
      h('td', {}, when(s.endAt)),
      h('td', { class: 'meta' }, meta),
      actions,
    )
  }

  form.addEventListener('submit', (ev) => {
    ev.preventDefault()
    void refresh()
  })
  running.addEventListener('change', () => void refresh())
  paused.addEventListener('change', () => void refresh())
  main.replaceChildren(
    h('h2', {}, 'Sandboxes'),
    form,
    status,
    h(
      'table',
      { id: 'sandboxes' },
      h(
        'thead',
        {},
        h(
          'tr',
          {},
          ...['id', 'template', 'state', 'resources', 'started', 'ends', 'metadata', ''].map((t) =>
            h('th', {}, t),
          ),
        ),
      ),
      body,
    ),
  )
  void refresh()
  return () => {
    stopped = true
    window.clearTimeout(timer)
  }
}

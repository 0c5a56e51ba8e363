// Templates (GET /templates) and snapshots (GET /snapshots).

import { api, ApiError } from './api'
import { bytes, errorText, h, notice, when } from './ui'

interface Template {
  templateID: string
  aliases?: string[]
  names?: string[]
  public?: boolean
  cpuCount?: number
  memoryMB?: number
  diskSizeMB?: number
  createdAt?: string
  buildStatus?: string
}

interface Snapshot {
  snapshotID: string
  names: string[]
  sandboxID: string
  templateID: string
  memory: boolean
  sizeBytes: number
  createdAt: string
}

function table(head: string[], rows: HTMLTableRowElement[], id: string): HTMLElement {
  return h(
    'table',
    { id },
    h('thead', {}, h('tr', {}, ...head.map((t) => h('th', {}, t)))),
    h('tbody', {}, ...rows),
  )
}

async function load<T>(
  main: HTMLElement,
  path: string,
  onAuthError: () => void,
): Promise<T | undefined> {
  try {
    return await api<T>('GET', path)
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) onAuthError()
    else main.append(notice(errorText(e), true))
    return undefined
  }
}

export async function renderTemplates(main: HTMLElement, onAuthError: () => void): Promise<void> {
  main.replaceChildren(h('h2', {}, 'Templates'))
  const list = await load<Template[]>(main, '/templates', onAuthError)
  if (!list) return
  const rows = list.map((t) =>
    h(
      'tr',
      {},
      h('td', {}, t.templateID),
      h('td', {}, (t.names ?? t.aliases ?? []).join(', ')),
      h('td', {}, t.buildStatus ?? ''),
      h('td', {}, t.cpuCount ? `${t.cpuCount} vCPU, ${t.memoryMB} MB` : ''),
      h('td', {}, t.public ? 'yes' : 'no'),
      h('td', {}, when(t.createdAt)),
    ),
  )
  main.append(
    notice(rows.length ? `${rows.length} template(s) built on this server` : 'No templates built yet.'),
    table(['id', 'names', 'build', 'resources', 'public', 'created'], rows, 'templates'),
  )
}

export async function renderSnapshots(main: HTMLElement, onAuthError: () => void): Promise<void> {
  main.replaceChildren(h('h2', {}, 'Snapshots'))
  const list = await load<Snapshot[]>(main, '/snapshots', onAuthError)
  if (!list) return
  const rows = list.map((s) =>
    h(
      'tr',
      {},
      h('td', {}, s.snapshotID),
      h('td', {}, s.names.join(', ')),
      h('td', {}, h('a', { href: `#/sandboxes/${encodeURIComponent(s.sandboxID)}` }, s.sandboxID)),
      h('td', {}, s.templateID),
      h('td', {}, s.memory ? 'files + memory' : 'files'),
      h('td', {}, bytes(s.sizeBytes)),
      h('td', {}, when(s.createdAt)),
    ),
  )
  main.append(
    notice(rows.length ? `${rows.length} snapshot(s)` : 'No snapshots yet.'),
    table(['id', 'names', 'sandbox', 'template', 'contents', 'size', 'created'], rows, 'snapshots'),
  )
}

// A file browser over envd's filesystem API and /files (list, download, upload) via the SDK.

import { FileType, type Sandbox } from 'e2b'
import { bytes, errorText, h, notice, when } from './ui'

function join(dir: string, name: string): string {
  return dir.endsWith('/') ? dir + name : `${dir}/${name}`
}

function parent(dir: string): string {
  const p = dir.replace(/\/+$/, '').split('/').slice(0, -1).join('/')
  return p || '/'
}

export function openFiles(box: HTMLElement, sbx: Sandbox, start = '/home/user'): void {
  let dir = start
  const pathInput = h('input', { id: 'files-path', value: dir })
  const upload = h('input', { type: 'file', id: 'files-upload', multiple: true })
  const status = h('div', { id: 'files-status' })
  const body = h('tbody', {})

  async function list(): Promise<void> {
    pathInput.value = dir
    try {
      const entries = await sbx.files.list(dir)
      entries.sort((a, b) =>
        a.type === b.type ? a.name.localeCompare(b.name) : a.type === FileType.DIR ? -1 : 1,
      )
      const rows = entries.map((e) => {
        const name =
          e.type === FileType.DIR
            ? h('a', { href: '#', class: 'dir' }, `${e.name}/`)
            : h('span', {}, e.name)
        if (e.type === FileType.DIR)
          name.addEventListener('click', (ev) => {
            ev.preventDefault()
            dir = join(dir, e.name)
            void list()
          })
        const actions = h('td', {})
        if (e.type === FileType.FILE) {
          const dl = h('button', { type: 'button', class: 'secondary download' }, 'Download')
          dl.addEventListener('click', () => void download(join(dir, e.name), e.name))
          actions.append(dl)
        }
        return h(
          'tr',
          { 'data-name': e.name },
          h('td', {}, name),
          h('td', {}, e.type === FileType.DIR ? '' : bytes(e.size)),
          h('td', {}, e.permissions),
          h('td', {}, e.owner),
          h('td', {}, e.modifiedTime ? when(e.modifiedTime.toISOString()) : ''),
          actions,
        )
      })
      body.replaceChildren(...rows)
      status.replaceChildren(notice(`${entries.length} entries in ${dir}`))
    } catch (e) {
      status.replaceChildren(notice(`${dir}: ${errorText(e)}`, true))
    }
  }

  async function download(path: string, name: string): Promise<void> {
    try {
      const blob = await sbx.files.read(path, { format: 'blob' })
      const url = URL.createObjectURL(blob)
      const a = h('a', { href: url, download: name })
      document.body.append(a)
      a.click()
      a.remove()
      setTimeout(() => URL.revokeObjectURL(url), 10_000)
    } catch (e) {
      status.replaceChildren(notice(`download ${path}: ${errorText(e)}`, true))
    }
  }

  upload.addEventListener('change', async () => {
    const files = Array.from(upload.files ?? [])
    for (const file of files) {
      status.replaceChildren(notice(`uploading ${file.name}…`))
      try {
        await sbx.files.write(join(dir, file.name), file)
      } catch (e) {
        status.replaceChildren(notice(`upload ${file.name}: ${errorText(e)}`, true))
        return
      }
    }
    upload.value = ''
    await list()
    status.replaceChildren(notice(`uploaded ${files.map((f) => f.name).join(', ')}`))
  })

  const up = h('button', { type: 'button', class: 'secondary' }, 'Up')
  up.addEventListener('click', () => {
    dir = parent(dir)
    void list()
  })
  const go = h('form', { class: 'files-bar' }, up, pathInput, h('button', { type: 'submit' }, 'Open'))
  go.addEventListener('submit', (ev) => {
    ev.preventDefault()
    dir = pathInput.value.trim() || '/'
    void list()
  })
  box.replaceChildren(
    go,
    h('label', { class: 'upload' }, 'Upload files here: ', upload),
    status,
    h(
      'table',
      { id: 'files' },
      h(
        'thead',
        {},
        h('tr', {}, ...['name', 'size', 'mode', 'owner', 'modified', ''].map((t) => h('th', {}, t))),
      ),
      body,
    ),
  )
  void list()
}

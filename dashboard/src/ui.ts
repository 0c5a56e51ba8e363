// A few DOM helpers: elements are built with textContent, never innerHTML, so nothing the API
// returns is ever parsed as markup.

type Attrs = Record<string, string | boolean | ((ev: Event) => void)>

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  ...children: (Node | string | null | undefined | false)[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag)
  for (const [name, value] of Object.entries(attrs)) {
    if (typeof value === 'function') el.addEventListener(name.replace(/^on/, ''), value)
    else if (value === true) el.setAttribute(name, '')
    else if (value !== false) el.setAttribute(name, value)
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue
    el.append(typeof child === 'string' ? document.createTextNode(child) : child)
  }
  return el
}

export function clear(el: Element, ...children: (Node | string)[]): void {
  el.replaceChildren(...children)
}

export function bytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB']
  let i = 0
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024
    i++
  }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`
}

export function when(iso: string | undefined): string {
  if (!iso) return ''
  const d = new Date(iso)
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString()
}

export function errorText(e: unknown): string {
  return e instanceof Error ? e.message : String(e)
}

/** A message line that tests and people can read: role=status, or role=alert for errors. */
export function notice(text: string, error = false): HTMLElement {
  return h('p', { class: error ? 'notice error' : 'notice', role: error ? 'alert' : 'status' }, text)
}

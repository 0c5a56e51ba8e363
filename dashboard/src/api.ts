// The control plane's REST API, called from the page with the key the user typed.
// The key lives in sessionStorage (gone when the tab closes) and travels only as X-API-KEY,
// never in a URL.

const KEY = 'warren.apiKey'

export function apiKey(): string | null {
  return sessionStorage.getItem(KEY)
}

export function setApiKey(key: string | null): void {
  if (key) sessionStorage.setItem(KEY, key)
  else sessionStorage.removeItem(KEY)
}

export class ApiError extends Error {
  constructor(
    public status: number,
    message: string,
  ) {
    super(message)
  }
}

/** Calls the API; JSON in and out. Errors carry the server's message. */
export async function api<T>(method: string, path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = { 'X-API-KEY': apiKey() ?? '' }
  if (body !== undefined) headers['Content-Type'] = 'application/json'
  const resp = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: 'omit',
    cache: 'no-store',
  })
  const text = await resp.text()
  if (!resp.ok) {
    let message = text || resp.statusText
    try {
      const parsed = JSON.parse(text) as { message?: string }
      if (parsed.message) message = parsed.message
    } catch {
      // not JSON: keep the text
    }
    throw new ApiError(resp.status, message)
  }
  return (text ? JSON.parse(text) : undefined) as T
}

/** Checks a key against the API; a wrong one is an ApiError with status 401. */
export async function checkKey(key: string): Promise<void> {
  const resp = await fetch('/v2/sandboxes?limit=1', {
    headers: { 'X-API-KEY': key },
    credentials: 'omit',
    cache: 'no-store',
  })
  if (resp.status === 401 || resp.status === 403) {
    throw new ApiError(resp.status, 'This API key was not accepted. Check it and try again.')
  }
  if (!resp.ok) throw new ApiError(resp.status, `The server answered ${resp.status}.`)
}

export interface Sandbox {
  sandboxID: string
  templateID: string
  alias?: string | null
  state: string
  startedAt: string
  endAt: string
  cpuCount: number
  memoryMB: number
  diskSizeMB: number
  metadata: Record<string, string>
  envdAccessToken?: string | null
  pauseMode?: string
  runtime?: { name: string }
}

export interface Metric {
  timestampUnix: number
  cpuCount: number
  cpuUsedPct: number
  memUsed: number
  memTotal: number
}

export const enc = encodeURIComponent

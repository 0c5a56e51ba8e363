// Pause, resume and kill: the E2B REST routes.

import { api, enc } from './api'

export async function pause(id: string): Promise<void> {
  await api('POST', `/sandboxes/${enc(id)}/pause`)
}

/** Resumes a paused sandbox (connect), for the server's default timeout. */
export async function resume(id: string): Promise<void> {
  await api('POST', `/v2/sandboxes/${enc(id)}/connect`, { timeout: 300 })
}

export async function kill(id: string): Promise<void> {
  await api('DELETE', `/sandboxes/${enc(id)}`)
}

// The sandbox's own API (envd: processes, files, terminals) through the official e2b JS SDK.
// Warren proxies it on this same origin: the SDK sends E2b-Sandbox-Id/-Port headers to
// sandboxUrl, with the sandbox's envd access token that connect hands out.

import { Sandbox } from 'e2b'
import { apiKey } from './api'

/** Connects to a running sandbox (POST /v2/sandboxes/{id}/connect; its timeout only grows). */
export function connectSandbox(id: string): Promise<Sandbox> {
  return Sandbox.connect(id, {
    apiKey: apiKey() ?? '',
    apiUrl: location.origin,
    sandboxUrl: location.origin,
    // A short timeout: connecting never shortens a running sandbox's life, and the dashboard
    // should not lengthen it either.
    timeoutMs: 1000,
  })
}

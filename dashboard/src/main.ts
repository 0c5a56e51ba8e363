// Warren's dashboard: log in with an API key, then sandboxes, templates and snapshots.
// Routes live in the URL's fragment (#/sandboxes/<id>); the server answers every
// /dashboard/ path with this page.

import './style.css'
import { ApiError, apiKey, checkKey, setApiKey } from './api'
import { renderSandboxes } from './sandboxes'
import { renderSandbox } from './sandbox'
import { renderSnapshots, renderTemplates } from './catalog'
import { errorText, h, notice } from './ui'

const app = document.getElementById('app') as HTMLElement
/** Called when the page changes, so the previous one stops its timers and streams. */
let leave: (() => void) | undefined

function loginPage(message?: string): void {
  const input = h('input', {
    type: 'password',
    id: 'api-key',
    name: 'api-key',
    autocomplete: 'off',
    placeholder: 'API key',
    required: true,
  })
  const status = h('div', { id: 'login-status' })
  if (message) status.append(notice(message, true))
  const form = h(
    'form',
    { class: 'login', id: 'login' },
    h('h1', {}, 'Warren'),
    h('label', { for: 'api-key' }, 'API key'),
    input,
    h('button', { type: 'submit' }, 'Log in'),
    status,
    h(
      'p',
      { class: 'hint' },
      'The key is kept in this tab only (sessionStorage) and sent as the X-API-KEY header.',
    ),
  )
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault()
    const key = input.value.trim()
    status.replaceChildren(notice('Checking the key…'))
    try {
      await checkKey(key)
      setApiKey(key)
      if (!location.hash || location.hash === '#/login') location.hash = '#/sandboxes'
      else route()
    } catch (e) {
      status.replaceChildren(notice(e instanceof ApiError ? e.message : errorText(e), true))
    }
  })
  app.replaceChildren(form)
  input.focus()
}

function shell(active: string): HTMLElement {
  const link = (href: string, text: string) =>
    h('a', { href, class: active === href ? 'active' : '' }, text)
  const main = h('main', { id: 'content' })
  const logout = h('button', { type: 'button', id: 'logout', class: 'secondary' }, 'Log out')
  logout.addEventListener('click', () => {
    setApiKey(null)
    location.hash = '#/login'
  })
  app.replaceChildren(
    h(
      'header',
      {},
      h('strong', {}, 'Warren'),
      h(
        'nav',
        {},
        link('#/sandboxes', 'Sandboxes'),
        link('#/templates', 'Templates'),
        link('#/snapshots', 'Snapshots'),
      ),
      logout,
    ),
    main,
  )
  return main
}

function route(): void {
  leave?.()
  leave = undefined
  if (!apiKey()) {
    loginPage()
    return
  }
  const path = location.hash.replace(/^#/, '') || '/sandboxes'
  const onAuthError = () => {
    setApiKey(null)
    loginPage('The API key is no longer accepted. Log in again.')
  }
  const sandbox = path.match(/^\/sandboxes\/([^/]+)$/)
  if (sandbox) {
    leave = renderSandbox(shell('#/sandboxes'), decodeURIComponent(sandbox[1]), onAuthError)
  } else if (path === '/templates') {
    renderTemplates(shell('#/templates'), onAuthError)
  } else if (path === '/snapshots') {
    renderSnapshots(shell('#/snapshots'), onAuthError)
  } else {
    leave = renderSandboxes(shell('#/sandboxes'), onAuthError)
  }
}

window.addEventListener('hashchange', route)
route()

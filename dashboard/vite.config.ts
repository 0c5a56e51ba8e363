import { defineConfig } from 'vite'

// Served by `warren serve` under /dashboard/ (crates/warren-server/src/dashboard.rs embeds dist/).
export default defineConfig({
  base: '/dashboard/',
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    // The SDK is large; one chunk keeps the embedded file set small and predictable.
    chunkSizeWarningLimit: 2000,
  },
})

// Live CPU and memory charts (uPlot) from GET /sandboxes/{id}/metrics, polled by the page.

import uPlot from 'uplot'
import 'uplot/dist/uPlot.min.css'
import type { Metric } from './api'
import { bytes, h, notice } from './ui'

const KEEP = 200
/** The last two minutes (uPlot's automatic range is years wide while there is one point). */
const window_: uPlot.Range.Function = (_u, _min, max) => [max - 120, max + 1]

export class MetricsCharts {
  private times: number[] = []
  private cpu: number[] = []
  private mem: number[] = []
  private cpuChart: uPlot
  private memChart: uPlot
  private note: HTMLElement

  constructor(box: HTMLElement) {
    this.note = h('div', { id: 'metrics-status' })
    const cpuBox = h('div', { class: 'chart', id: 'chart-cpu' })
    const memBox = h('div', { class: 'chart', id: 'chart-mem' })
    box.replaceChildren(this.note, cpuBox, memBox)
    const width = Math.max(320, Math.min(900, box.clientWidth || 900))
    this.cpuChart = new uPlot(
      {
        title: 'CPU used (%)',
        width,
        height: 200,
        scales: { x: { time: true, range: window_ }, y: { range: [0, 100] } },
        series: [{}, { label: 'CPU %', stroke: '#2563eb', width: 2 }],
      },
      [[], []],
      cpuBox,
    )
    this.memChart = new uPlot(
      {
        title: 'Memory used',
        width,
        height: 200,
        scales: { x: { time: true, range: window_ } },
        axes: [{}, { values: (_u, ticks) => ticks.map((t) => bytes(t)), size: 80 }],
        series: [
          {},
          { label: 'memory', stroke: '#16a34a', width: 2, value: (_u, v) => (v == null ? '' : bytes(v)) },
        ],
      },
      [[], []],
      memBox,
    )
  }

  add(points: Metric[]): void {
    const last = this.times[this.times.length - 1] ?? 0
    for (const p of [...points].sort((a, b) => a.timestampUnix - b.timestampUnix)) {
      if (p.timestampUnix <= last && this.times.length) continue
      this.times.push(p.timestampUnix)
      this.cpu.push(p.cpuUsedPct)
      this.mem.push(p.memUsed)
    }
    if (this.times.length > KEEP) {
      const cut = this.times.length - KEEP
      this.times.splice(0, cut)
      this.cpu.splice(0, cut)
      this.mem.splice(0, cut)
    }
    this.cpuChart.setData([this.times, this.cpu])
    this.memChart.setData([this.times, this.mem])
    this.cpuChart.root.parentElement?.setAttribute('data-points', String(this.times.length))
    const p = points[points.length - 1]
    if (p) {
      this.note.replaceChildren(
        notice(
          `CPU ${p.cpuUsedPct.toFixed(1)}% of ${p.cpuCount} vCPU, memory ${bytes(p.memUsed)} of ${bytes(p.memTotal)}`,
        ),
      )
    }
  }

  message(text: string): void {
    this.note.replaceChildren(notice(text))
  }

  destroy(): void {
    this.cpuChart.destroy()
    this.memChart.destroy()
  }
}

//! Helper the namespace runtime starts for each sandbox; see `warren_runtime_ns::nsinit`.

fn main() {
    warren_runtime_ns::nsinit::main()
}

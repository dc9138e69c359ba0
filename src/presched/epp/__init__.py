"""presched as a Gateway API Inference Extension endpoint picker (Envoy ext_proc gRPC): the
`Gateway` decisions of `presched serve` inside the gateways people deploy. See docs/epp.md."""

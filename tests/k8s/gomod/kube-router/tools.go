//go:build tools

// Package tools pins kube-router, run in firewall-only mode as the test cluster's
// NetworkPolicy enforcer (tests/k8s/README.md).
package tools

import _ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"

//go:build tools

// Package tools pins the Kubernetes commands that tests/k8s/build.sh builds; the go.mod
// beside it pins their versions (k8s.io/kubernetes and its staging modules).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)

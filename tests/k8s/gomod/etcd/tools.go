//go:build tools

// Package tools pins etcd's server (its module root is package main, built by
// tests/k8s/build.sh as `go build go.etcd.io/etcd/server/v3`).
package tools

import _ "go.etcd.io/etcd/server/v3/etcdmain"

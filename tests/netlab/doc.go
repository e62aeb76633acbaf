// Package netlab proves workmesh on a small internet it builds in Linux
// network namespaces (as root, with iproute2 and nftables): an "internet"
// bridge in a namespace of its own, public hosts on it, and sites behind
// NAT routers (masquerading, symmetric, dropping UDP), with real
// `workmesh node start` processes, one per namespace. It uses only
// documentation ranges inside the namespaces it made, never touches the
// root namespace's interfaces, and removes everything it made. Without
// root or the tools its tests skip, unless WMTEST_NETNS=1 (CI) makes them
// fail.
package netlab

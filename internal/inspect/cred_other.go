//go:build !linux

package inspect

import "net"

// samePeer: without SO_PEERCRED the socket file's mode (0600) and its directory keep other
// users out.
func samePeer(*net.UnixConn) bool { return true }

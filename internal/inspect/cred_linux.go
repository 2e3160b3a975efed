//go:build linux

package inspect

import (
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// samePeer tells whether the process at the other end of c runs as this process's user
// (SO_PEERCRED): the socket's mode keeps other users out of a socket file, and this check
// keeps them out of an abstract socket, which has no mode.
func samePeer(c *net.UnixConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return false
	}
	return int(cred.Uid) == os.Getuid()
}

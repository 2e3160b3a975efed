//go:build unix

package inspect

import (
	"fmt"
	"os"
	"syscall"
)

// private checks that d is a directory of this user's that no one else can enter.
func private(d string) error {
	fi, err := os.Lstat(d)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Getuid() || fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("%s is not a directory of mode 0700 owned by this user", d)
	}
	return nil
}

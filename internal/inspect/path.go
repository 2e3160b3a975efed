package inspect

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// SocketName is the endpoint's socket in the store directory, when its path fits a Unix
// socket address.
const SocketName = "WORKLOG.sock" // pebblelog.SocketFile

// PointerName is the file in the store directory that names the endpoint's socket when
// DIR/WORKLOG.sock is too long for a socket address: a socket in the user's runtime
// directory (XDG_RUNTIME_DIR, else a directory of mode 0700 under os.TempDir) named by a
// hash of the store directory, or, when even that is too long, a Linux abstract socket
// ("@worklog-<uid>-<hash>").
const PointerName = "WORKLOG.sock-path"

// maxPathLen is the longest path a Unix socket address holds (sun_path less its NUL): 108
// bytes on Linux, 104 on the BSDs and macOS.
func maxPathLen() int {
	if runtime.GOOS == "linux" {
		return 107
	}
	return 103
}

// canonical is dir made absolute with its symbolic links resolved, the same spelling for
// the server and every client, so that both find the same socket.
func canonical(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	return abs, nil
}

// fallbackAddr is the socket address of a store directory whose own socket path is too long.
func fallbackAddr(dir string) (string, error) {
	sum := sha256.Sum256([]byte(dir))
	name := "worklog-" + hex.EncodeToString(sum[:12]) + ".sock"
	rd, err := runtimeDir()
	if err == nil {
		if p := filepath.Join(rd, name); len(p) <= maxPathLen() {
			return p, nil
		}
	}
	if runtime.GOOS == "linux" {
		return fmt.Sprintf("@worklog-%d-%s", os.Getuid(), hex.EncodeToString(sum[:12])), nil
	}
	if err == nil {
		err = errors.New("the runtime directory's path is too long for a socket")
	}
	return "", err
}

// runtimeDir is a directory only this user can enter: XDG_RUNTIME_DIR when set and so, else
// os.TempDir()/worklog-<uid>, created with mode 0700 and checked to be this user's own.
func runtimeDir() (string, error) {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" && private(d) == nil {
		return d, nil
	}
	d := filepath.Join(os.TempDir(), fmt.Sprintf("worklog-%d", os.Getuid()))
	if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	return d, private(d)
}

// resolve is where a client finds the endpoint of dir: the pointer file's address when there
// is one, else DIR/WORKLOG.sock.
func resolve(dir string) (string, error) {
	cd, err := canonical(dir)
	if err != nil {
		return "", err
	}
	b, err := readSmall(filepath.Join(cd, PointerName))
	if err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	return filepath.Join(cd, SocketName), nil
}

func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, 4096)
	n, err := f.Read(b)
	if n == 0 && err != nil {
		return nil, err
	}
	return b[:n], nil
}

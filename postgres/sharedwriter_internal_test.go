package postgres

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// silentPeer listens like an elected process that stopped right after its handshake: its
// socket stays open, and nothing it is sent is read or answered.
func silentPeer(t *testing.T, token []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { nc.Close() })
			hello := make([]byte, len(swMagic)+swTokenLen)
			if _, err := io.ReadFull(nc, hello); err != nil {
				nc.Close()
				continue
			}
			nc.Write([]byte{1}) // and then never a word
		}
	}()
	return ln.Addr().String()
}

// TestSharedWriterStoppedPeerIsGivenUp: a round sent to an elected process that stopped
// answering ends with errSharedWriterLost once nothing came for swPingWait, the connection
// is dead (the next round runs here), and the shared writer is told to look again.
func TestSharedWriterStoppedPeerIsGivenUp(t *testing.T) {
	setFor(t, &swPingEvery, 50*time.Millisecond)
	setFor(t, &swPingWait, 300*time.Millisecond)
	token := make([]byte, swTokenLen)
	addr := silentPeer(t, token)
	lost := make(chan struct{}, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := dialShared(ctx, addr, token, lost)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, sent, err := c.call(ctx, []byte("a round"))
	took := time.Since(start)
	if !sent || !errors.Is(err, errSharedWriterLost) {
		t.Fatalf("a round to a stopped peer: sent %v, err %v after %v; want errSharedWriterLost", sent, err, took)
	}
	if took < swPingWait || took > 10*swPingWait {
		t.Fatalf("given up after %v, want about %v", took, swPingWait)
	}
	select {
	case <-lost:
	default:
		t.Fatal("the shared writer was not told to look again")
	}
	if _, sent, _ := c.call(ctx, []byte("a round")); sent {
		t.Fatal("a round was sent on a connection given up")
	}
}

// TestSharedWriterWrongTokenRefused: an elected process's listener refuses a peer without
// its token, and a follower refuses an address whose listener does not answer the
// handshake.
func TestSharedWriterWrongTokenRefused(t *testing.T) {
	token := make([]byte, swTokenLen)
	token[0] = 1
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s := &sharedWriter{e: &engine{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		s.serveConn(context.Background(), nc, token)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := dialShared(ctx, ln.Addr().String(), make([]byte, swTokenLen), make(chan struct{}, 1)); err == nil {
		t.Fatal("a wrong token was accepted")
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the listener's connection did not end after a wrong token")
	}
}

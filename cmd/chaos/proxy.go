package main

import (
	"io"
	"net"
	"sync"
	"time"
)

// proxy forwards TCP connections from one client process to the server, and can cut them:
// "freeze" holds every byte (nothing answers, the connections stay open: a network that
// drops every packet), "drop" closes every connection and refuses new ones, "delay" holds
// each chunk for a while before it goes on.
type proxy struct {
	l      net.Listener
	target string

	mu    sync.Mutex
	mode  string // "", "freeze", "drop", "delay"
	delay time.Duration
	cond  *sync.Cond
	conns map[net.Conn]bool
}

func newProxy(target string) (*proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{l: l, target: target, conns: map[net.Conn]bool{}}
	p.cond = sync.NewCond(&p.mu)
	go p.serve()
	return p, nil
}

func (p *proxy) addr() string { return p.l.Addr().String() }

func (p *proxy) set(mode string, delay time.Duration) {
	p.mu.Lock()
	p.mode, p.delay = mode, delay
	if mode == "drop" {
		for c := range p.conns {
			c.Close()
		}
	}
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *proxy) close() {
	p.l.Close()
	p.set("drop", 0)
}

func (p *proxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.mode == "drop" {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.mu.Unlock()
		s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = true, true
		p.mu.Unlock()
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

// gate waits while the proxy is frozen; false when the connection must be dropped.
func (p *proxy) gate() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.mode == "freeze" {
		p.cond.Wait()
	}
	if p.mode == "delay" {
		d := p.delay
		p.mu.Unlock()
		time.Sleep(d)
		p.mu.Lock()
	}
	return p.mode != "drop"
}

func (p *proxy) pipe(from, to net.Conn) {
	defer func() {
		from.Close()
		to.Close()
		p.mu.Lock()
		delete(p.conns, from)
		delete(p.conns, to)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			if !p.gate() {
				return
			}
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}

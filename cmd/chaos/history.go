package main

import (
	"bufio"
	"encoding/json"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
)

// A rec is one line of a history file: an operation's invocation ("invoke") or completion
// ("ok", "fail": it did not happen; "info": its outcome is unknown), a handler's interval
// ("hstart", "hend"), or a nemesis action (the controller's file). An invocation without a
// completion (its process died) is an unknown outcome.
type rec struct {
	P  string `json:"p"`            // process: "c2.1" = client 2, incarnation 1
	I  int64  `json:"i,omitempty"`  // operation number within P
	T  string `json:"t"`            // invoke|ok|fail|info|hstart|hend|nemesis
	F  string `json:"f,omitempty"`  // operation
	At int64  `json:"at"`           // real time, Unix ns (the host's clock: one host)
	Ak int64  `json:"ak,omitempty"` // the operation's clock (At twins): real time plus the process's skew

	Sess    string   `json:"s,omitempty"`
	Key     string   `json:"k,omitempty"`
	Kind    string   `json:"kind,omitempty"`
	Intent  int      `json:"in,omitempty"`
	OpID    string   `json:"op,omitempty"` // the header naming a submit's op in the log
	Task    string   `json:"task,omitempty"`
	Wake    string   `json:"wake,omitempty"`
	Attempt uint32   `json:"a,omitempty"`
	Exp     int64    `json:"exp,omitempty"` // a lease's expiry (the queue's clock), Unix ns
	Claims  []claimR `json:"c,omitempty"`   // what a claim returned
	Err     string   `json:"err,omitempty"`
	State   string   `json:"st,omitempty"`
	Target  string   `json:"tgt,omitempty"` // nemesis: the process or "server"
	Pid     int      `json:"pid,omitempty"`
}

type claimR struct {
	Task    string `json:"task,omitempty"`
	Wake    string `json:"wake,omitempty"`
	Attempt uint32 `json:"a"`
	Exp     int64  `json:"exp"`
}

// hist appends recs to one file, each line written at once (a SIGKILL loses no line that
// was written before it).
type hist struct {
	mu sync.Mutex
	f  *os.File
	p  string
	n  int64
}

func newHist(path, p string) (*hist, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &hist{f: f, p: p}, nil
}

func (h *hist) write(r rec) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r.P = h.p
	if r.At == 0 {
		r.At = time.Now().UnixNano()
	}
	b, _ := json.Marshal(r)
	h.f.Write(append(b, '\n'))
}

// invoke records an invocation and returns its number.
func (h *hist) invoke(r rec) int64 {
	h.mu.Lock()
	h.n++
	n := h.n
	h.mu.Unlock()
	r.I, r.T = n, "invoke"
	h.write(r)
	return n
}

func (h *hist) close() { h.f.Close() }

// readHistories reads every history file of dir, in real-time order.
func readHistories(dir string) ([]rec, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var all []rec
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".jsonl") {
			continue
		}
		f, err := os.Open(dir + "/" + e.Name())
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			var r rec
			if json.Unmarshal(sc.Bytes(), &r) != nil {
				continue // a line cut by a SIGKILL
			}
			all = append(all, r)
		}
		f.Close()
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].At < all[j].At })
	return all, nil
}

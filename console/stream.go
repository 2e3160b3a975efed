package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/worklog/worklog/events"
)

// streamRow is one event of the live tail, as the log page's row shows it.
type streamRow struct {
	Seq     uint64 `json:"seq"`
	At      string `json:"at"`
	Session string `json:"session"`
	Event   string `json:"event"`
	Subject string `json:"subject"`
	Details string `json:"details"`
}

// stream is GET /log/stream: the log's live tail as Server-Sent Events over Queue.Follow,
// from ?from=N on, with the log page's type, session and kind filters. Each event is one
// "data:" line of JSON (the script puts it in the page with textContent: never as HTML).
func (c *Console) stream(w http.ResponseWriter, r *http.Request) {
	qs := r.URL.Query()
	from := uint64(0)
	if s := qs.Get("from"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			writeJSONError(w, badRequest("from %q is not a sequence number", s))
			return
		}
		from = n
	}
	var typ events.Type
	if s := qs.Get("type"); s != "" {
		t, ok := events.TypeByName(s)
		if !ok {
			writeJSONError(w, badRequest("type %q is not an event type", s))
			return
		}
		typ = t
	}
	session, kind := qs.Get("session"), qs.Get("kind")
	fl, ok := w.(http.Flusher)
	if !ok {
		writeJSONError(w, &httpError{code: http.StatusInternalServerError, msg: "the server cannot stream"})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	_, _ = fmt.Fprint(w, ": worklog console live tail\n\n")
	fl.Flush()
	ctx := r.Context()
	err := c.q.Follow(ctx, from, func(ev events.Event) error {
		h := ev.Head()
		if typ != 0 && ev.Type() != typ {
			return nil
		}
		if session != "" && h.SessionID != session {
			return nil
		}
		tid, wid := ev.Subject()
		if kind != "" {
			if err := c.ix.catchUp(ctx); err != nil {
				return err
			}
			c.ix.mu.RLock()
			k := ""
			if ti, ok := c.ix.byID[tid]; ok && tid != "" {
				k = c.ix.tasks[ti].kind
			} else if ti, ok := c.ix.wakeOf[wid]; ok {
				k = c.ix.tasks[ti].kind
			}
			c.ix.mu.RUnlock()
			if k != kind {
				return nil
			}
		}
		subject := tid
		if subject == "" {
			subject = wid
		}
		b, err := json.Marshal(streamRow{Seq: h.Seq, At: fmtTime(h.At), Session: h.SessionID, Event: ev.Type().String(), Subject: subject, Details: details(ev)})
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return err
		}
		fl.Flush()
		return nil
	})
	if err != nil && ctx.Err() == nil && !errors.Is(err, ctx.Err()) {
		c.log.Warn("console: live tail ended", "err", err)
		b, _ := json.Marshal(map[string]string{"error": err.Error()})
		_, _ = fmt.Fprintf(w, "event: error\ndata: %s\n\n", b)
		fl.Flush()
	}
}

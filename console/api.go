package console

import (
	"context"
	"errors"
	"fmt"
	"html"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/worklog/worklog/events"
	"github.com/worklog/worklog/work"
)

// apiTask is GET /api/tasks/{id}[?at_seq=N]: the task object of replay state --json.
func (c *Console) apiTask(r *http.Request) (any, error) {
	c.ix.mu.RLock()
	defer c.ix.mu.RUnlock()
	ct, he := c.cutOf(r)
	if he != nil {
		return nil, he
	}
	t, _, err := c.taskAt(r.Context(), r.PathValue("id"), ct.seq)
	if err != nil {
		return nil, err
	}
	return taskObject(t), nil
}

type statsJSON struct {
	LastSeq      uint64           `json:"last_seq"`
	At           string           `json:"at,omitempty"`
	Sessions     int              `json:"sessions"`
	Tasks        stateCountJSON   `json:"tasks"`
	Kinds        []kindJSON       `json:"kinds"`
	DueNow       *int64           `json:"due_now,omitempty"`
	OldestDueAge string           `json:"oldest_due_age,omitempty"`
	Events       map[string]int64 `json:"events"`
}

type stateCountJSON struct {
	Total     int64 `json:"total"`
	Pending   int64 `json:"pending"`
	Running   int64 `json:"running"`
	Succeeded int64 `json:"succeeded"`
	Failed    int64 `json:"failed"`
	Canceled  int64 `json:"canceled"`
}

type kindJSON struct {
	Kind string `json:"kind"`
	stateCountJSON
}

func countJSON(c [nStates]int64) stateCountJSON {
	return stateCountJSON{Total: c[0] + c[1] + c[2] + c[3] + c[4], Pending: c[0], Running: c[1], Succeeded: c[2], Failed: c[3], Canceled: c[4]}
}

// apiStats is GET /api/stats: the queue's counts (Queue.Stats: kept by the fold, not a scan),
// due figures, and the index's event counts.
func (c *Console) apiStats(r *http.Request) (any, error) {
	st, err := c.q.Stats(r.Context())
	if err != nil {
		return nil, err
	}
	c.ix.mu.RLock()
	defer c.ix.mu.RUnlock()
	j := &statsJSON{LastSeq: c.ix.lastSeq, Sessions: len(c.ix.sess), Events: map[string]int64{}, Kinds: []kindJSON{}}
	if n := len(c.ix.evs); n > 0 {
		j.At = jsonTime(c.ix.evs[n-1].at)
	}
	t := st.Total
	j.Tasks = countJSON([nStates]int64{t.Pending, t.Running, t.Succeeded, t.Failed, t.Canceled})
	for _, k := range st.Kinds {
		j.Kinds = append(j.Kinds, kindJSON{Kind: k.Kind, stateCountJSON: countJSON([nStates]int64{k.Pending, k.Running, k.Succeeded, k.Failed, k.Canceled})})
	}
	due := st.DueNow
	j.DueNow = &due
	if due > 0 {
		j.OldestDueAge = st.OldestDueAge.String()
	}
	for ty, n := range c.ix.types {
		j.Events[ty.String()] = n
	}
	return j, nil
}

// action wraps a POST on a task: the Host, Authorize, Actions and same-origin checks were
// made in ServeHTTP.
// A form from the console's own page is answered with a redirect back to the task's page; a
// script's call with the task object as JSON.
func (c *Console) action(fn func(ctx context.Context, session, id string) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		form, fail := c.failer(w, r)
		ctx := r.Context()
		if err := c.ix.catchUp(ctx); err != nil {
			fail(asHTTPError(err))
			return
		}
		id := r.PathValue("id")
		c.ix.mu.RLock()
		ti, ok := c.ix.byID[id]
		session := ""
		if ok {
			session = c.ix.tasks[ti].session
		}
		c.ix.mu.RUnlock()
		if !ok {
			fail(notFound("There is no task %q in this queue's log.", id))
			return
		}
		if err := fn(ctx, session, id); err != nil {
			fail(asHTTPError(err))
			return
		}
		if err := c.ix.catchUp(ctx); err != nil {
			fail(asHTTPError(err))
			return
		}
		if form {
			// Relative, so that it stays under the prefix the console is mounted at
			// (http.Redirect would make it absolute from the stripped path).
			w.Header().Set("Location", "../../../tasks/"+pathEscape(id))
			w.WriteHeader(http.StatusSeeOther)
			return
		}
		c.ix.mu.RLock()
		t, _, err := c.taskAt(ctx, id, c.ix.lastSeq)
		c.ix.mu.RUnlock()
		if err != nil {
			fail(asHTTPError(err))
			return
		}
		writeJSON(w, http.StatusOK, taskObject(t))
	}
}

func (c *Console) cancel(ctx context.Context, session, id string) error {
	_, err := c.q.Session(session).Cancel(ctx, id)
	return err
}

// retry is the session's Retry, at once: a failed or canceled task pending again.
func (c *Console) retry(ctx context.Context, session, id string) error {
	_, err := c.q.Session(session).Retry(ctx, id, time.Time{})
	return err
}

// verify is GET /verify: a page with a button, and with ?run=1 the check itself, streamed as
// it goes (progress without JavaScript): every retained event is read and decoded in order
// and checked gap-free but for the pruned ranges, then the queue's own Verify rebuilds the
// projection from the log and compares it with the stored one.
func (c *Console) verify(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if err := c.ix.catchUp(ctx); err != nil {
		c.errorPage(w, r, asHTTPError(err))
		return
	}
	p := &page{Title: "Verify", Nav: "verify", Root: rootOf(r.URL.EscapedPath()), ReadOnly: !c.actions}
	c.ix.mu.RLock()
	p.Head = c.ix.lastSeq
	c.ix.mu.RUnlock()
	if r.URL.Query().Get("run") != "1" {
		c.render(w, http.StatusOK, "verify", p)
		return
	}
	p.Data = true
	var b strings.Builder
	if err := c.pages["verify"].ExecuteTemplate(&b, "layout.html", p); err != nil {
		http.Error(w, "internal error: the page could not be rendered", http.StatusInternalServerError)
		return
	}
	// The page is sent up to the progress list's end, then a line per step, then the rest.
	full := b.String()
	i := strings.Index(full, `id="verify-progress">`)
	j := i + strings.Index(full[i:], "</ul>")
	head, tailHTML := full[:j], full[j:]
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	fl, _ := w.(http.Flusher)
	_, _ = io.WriteString(w, head)
	line := func(class, s string) {
		_, _ = fmt.Fprintf(w, "<li class=\"%s\">%s</li>\n", class, html.EscapeString(s))
		if fl != nil {
			fl.Flush()
		}
	}
	total := p.Head
	var n, prev uint64
	started := time.Now()
	gaps := 0
	err := c.q.ReadLog(ctx, 0, func(ev events.Event) error {
		s := ev.Head().Seq
		if s != prev+1 {
			gaps++
		}
		prev = s
		n++
		if n%100_000 == 0 {
			line("progress", fmt.Sprintf("read and decoded %d events (seq %d of %d)", n, s, total))
		}
		return nil
	})
	switch {
	case err != nil:
		line("bad", "reading the log failed: "+err.Error())
	default:
		line("progress", fmt.Sprintf("read and decoded all %d retained events up to seq %d in %s; %d pruned range(s) before or between them", n, prev, fmtDuration(time.Since(started)), gaps))
		line("progress", "rebuilding the projection from the log and comparing it with the stored one (Queue.Verify)…")
		verr := c.q.Verify(ctx)
		var ve *work.VerifyError
		switch {
		case verr == nil:
			line("ok", "OK: the stored projection is exactly the fold of the log")
		case errors.As(verr, &ve):
			for i, pr := range ve.Problems {
				if i == 100 {
					line("bad", fmt.Sprintf("… and %d more problems", len(ve.Problems)-100))
					break
				}
				line("bad", pr)
			}
		default:
			line("bad", "verify failed: "+verr.Error())
		}
	}
	_, _ = io.WriteString(w, tailHTML)
}

// failer is how a POST handler answers an error: a page for the console's own forms (form is
// true), JSON for a script's call.
func (c *Console) failer(w http.ResponseWriter, r *http.Request) (form bool, fail func(*httpError)) {
	form = strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded")
	return form, func(e *httpError) {
		if form {
			c.errorPage(w, r, e)
			return
		}
		writeJSONError(w, e)
	}
}

// Package console is worklog's web console: an http.Handler over any *work.Queue that shows
// the queue live and as it was at any past sequence number, from the same fold as the store
// and the replay tool (docs/console.md). Mount it behind the application's own auth, under a
// prefix with http.StripPrefix; `replay serve` serves it read-only over a store.
package console

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/worklog/worklog/work"
)

// Options configures New. A nil *Options means all defaults.
type Options struct {
	ReadOnly bool         // no actions: every POST is refused with 403
	Logger   *slog.Logger // nil: discarded
	// TraceURL links a task page's trace id (from the W3C traceparent header the submitter
	// put in the task's Headers, e.g. with contrib/otelworklog) to a tracing UI: the URL with
	// {trace_id} replaced by the 32 hex digits, such as
	// "https://jaeger.example.com/trace/{trace_id}". It must be an http or https URL holding
	// {trace_id}. "": the trace id is shown without a link.
	TraceURL string
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets/*
var assetFS embed.FS

// csp forbids every script but the console's own file, every inline script and style, every
// frame and every form target elsewhere: a string from a user that escaped escaping still
// could not run.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// Console is the handler New returns.
type Console struct {
	q        *work.Queue
	ro       bool
	traceURL string // Options.TraceURL
	log      *slog.Logger
	ix       *index
	mux      *http.ServeMux
	pages    map[string]*template.Template
}

// New returns the console of q. It reads q's log (Queue.ReadLog) into its own index at once,
// and what is new at each request after that; q must keep a log (every queue of this module
// does).
func New(q *work.Queue, opts *Options) (http.Handler, error) {
	if q == nil {
		return nil, errors.New("console: nil queue")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.TraceURL != "" {
		u, err := url.Parse(strings.ReplaceAll(o.TraceURL, "{trace_id}", "0"))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || !strings.Contains(o.TraceURL, "{trace_id}") {
			return nil, fmt.Errorf("console: Options.TraceURL %q: must be an http(s) URL holding {trace_id}", o.TraceURL)
		}
	}
	c := &Console{q: q, ro: o.ReadOnly, log: o.Logger, ix: newIndex(q), traceURL: o.TraceURL}
	if err := c.ix.catchUp(context.Background()); err != nil {
		return nil, fmt.Errorf("console: reading the queue's log: %w", err)
	}
	if err := c.parseTemplates(); err != nil {
		return nil, err
	}
	c.routes()
	return c, nil
}

func (c *Console) parseTemplates() error {
	c.pages = map[string]*template.Template{}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return err
	}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if base == "layout" {
			continue
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", n)
		if err != nil {
			return fmt.Errorf("console: template %s: %w", n, err)
		}
		c.pages[base] = t
	}
	return nil
}

func (c *Console) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", c.page(c.overview))
	m.HandleFunc("GET /sessions", c.page(c.sessions))
	m.HandleFunc("GET /sessions/{id}", c.page(c.session))
	m.HandleFunc("GET /tasks/{id}", c.page(c.task))
	m.HandleFunc("GET /log", c.page(c.logPage))
	m.HandleFunc("GET /stats", c.page(c.statsPage))
	m.HandleFunc("GET /verify", c.verify)
	m.HandleFunc("GET /api/tasks/{id}", c.api(c.apiTask))
	m.HandleFunc("GET /api/stats", c.api(c.apiStats))
	m.HandleFunc("POST /api/tasks/{id}/cancel", c.action(c.cancel))
	m.HandleFunc("POST /api/tasks/{id}/retry", c.action(c.retry))
	m.HandleFunc("GET /log/stream", c.stream)
	m.Handle("GET /assets/", http.FileServerFS(assetFS))
	m.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeJSONError(w, &httpError{code: http.StatusNotFound, msg: "no such API route: " + r.Method + " " + r.URL.Path})
	})
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		c.errorPage(w, r, &httpError{code: http.StatusNotFound, msg: "There is no page at " + r.URL.Path + "."})
	})
	c.mux = m
}

// ServeHTTP sets the security headers of every answer, refuses a cross-origin POST and turns a
// panic into a plain 500 page (logged, never shown with a stack).
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Content-Type-Options", "nosniff")
	// same-origin, not no-referrer: under no-referrer a browser sends "Origin: null" with a
	// form's POST, which the same-origin rule must refuse.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cache-Control", "no-store")
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			c.log.Error("console: panic serving a request", "path", r.URL.Path, "panic", fmt.Sprint(v))
			http.Error(w, "internal error: the console failed on this request (see the application's log)", http.StatusInternalServerError)
		}
	}()
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if !sameOrigin(r) {
			writeJSONError(w, &httpError{code: http.StatusForbidden, msg: "cross-origin request refused: the console accepts actions only from its own pages"})
			return
		}
		if c.ro {
			writeJSONError(w, &httpError{code: http.StatusForbidden, msg: "this console is read-only: actions are disabled"})
			return
		}
	}
	c.mux.ServeHTTP(w, r)
}

// sameOrigin is the spec's rule: an Origin naming another host, or Sec-Fetch-Site:
// cross-site, is not the console's own page.
func sameOrigin(r *http.Request) bool {
	if strings.EqualFold(r.Header.Get("Sec-Fetch-Site"), "cross-site") {
		return false
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	if err != nil || u.Host == "" {
		return false // "null" (a sandboxed or file page) and garbage are not the console
	}
	return strings.EqualFold(u.Host, r.Host)
}

// httpError is an answer that is not the page asked for: a status and one clear sentence.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(format string, a ...any) *httpError {
	return &httpError{code: http.StatusBadRequest, msg: fmt.Sprintf(format, a...)}
}

func notFound(format string, a ...any) *httpError {
	return &httpError{code: http.StatusNotFound, msg: fmt.Sprintf(format, a...)}
}

// asHTTPError turns any error into one: the queue's kinds to their statuses, anything else a
// 500 naming the cause (never a stack).
func asHTTPError(err error) *httpError {
	var he *httpError
	if errors.As(err, &he) {
		return he
	}
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, work.ErrTaskNotFound):
		code = http.StatusNotFound
	case errors.Is(err, work.ErrInvalidRequest):
		code = http.StatusBadRequest
	case errors.Is(err, work.ErrInvalidTransition), errors.Is(err, work.ErrIdempotencyConflict), errors.Is(err, work.ErrStaleDelivery):
		code = http.StatusConflict
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		code = http.StatusServiceUnavailable
	}
	return &httpError{code: code, msg: err.Error()}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(true)
	_ = enc.Encode(v)
}

func writeJSONError(w http.ResponseWriter, e *httpError) {
	writeJSON(w, e.code, map[string]any{"error": e.msg, "status": e.code})
}

// cut is the point a request looks at: now (the head of the log) or a past seq.
type cut struct {
	seq      uint64 // the last event folded
	head     uint64 // the log's last seq
	past     bool
	at       int64  // the time of event seq
	asked    string // ?at=TIME as given
	firstSeq uint64 // the first retained seq
}

// cutOf reads ?at_seq=N or ?at=TIME. Call with the index read-locked.
func (c *Console) cutOf(r *http.Request) (cut, *httpError) {
	ix := c.ix
	ct := cut{seq: ix.lastSeq, head: ix.lastSeq}
	if len(ix.evs) > 0 {
		ct.firstSeq = ix.evs[0].seq
		ct.at = ix.evs[len(ix.evs)-1].at
	}
	qs := r.URL.Query()
	s, t := qs.Get("at_seq"), qs.Get("at")
	switch {
	case s != "" && t != "":
		return ct, badRequest("give at_seq or at, not both")
	case s != "":
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil || n == 0 {
			return ct, badRequest("at_seq %q is not a sequence number: it must be a whole number from 1 to %d (the log's last seq)", s, ix.lastSeq)
		}
		if n > ix.lastSeq {
			return ct, badRequest("at_seq %d is past the end of the log: the last seq is %d", n, ix.lastSeq)
		}
		ct.seq = n
	case t != "":
		tm, err := time.Parse(time.RFC3339Nano, t)
		if err != nil {
			return ct, badRequest("at %q is not a time: write it as RFC 3339, for example 2026-03-02T09:00:00Z", t)
		}
		n := ix.seqAtTime(tm.UnixNano())
		if n == 0 {
			return ct, badRequest("nothing in the log is stamped at or before %s: the log starts later", tm.UTC().Format(time.RFC3339Nano))
		}
		ct.seq, ct.asked = n, t
	default:
		return ct, nil
	}
	p := ix.pos(ct.seq)
	if p == 0 || ix.evs[p-1].seq != ct.seq {
		return ct, &httpError{code: http.StatusGone, msg: fmt.Sprintf("seq %d was pruned from this store: its history is gone (retained history starts at seq %d)", ct.seq, ct.firstSeq)}
	}
	ct.at = ix.evs[p-1].at
	ct.past = ct.seq < ix.lastSeq
	return ct, nil
}

// page is what every HTML page's layout reads.
type page struct {
	Title    string
	Root     string // the relative path from this page to the console's root: "./" or "../"
	Nav      string
	Cut      cut
	Past     bool
	AtSeq    uint64
	AtTime   string
	Head     uint64
	ReadOnly bool
	Keep     string // "?at_seq=N" on a past page: links stay in the past
	NowURL   string
	Data     any
}

type pageFunc func(r *http.Request, p *page) (tmpl string, err error)

// page wraps a page handler: catch up, read the cut, render, or render the error page.
func (c *Console) page(fn pageFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := c.ix.catchUp(r.Context()); err != nil {
			c.errorPage(w, r, asHTTPError(err))
			return
		}
		c.ix.mu.RLock()
		ct, he := c.cutOf(r)
		if he != nil {
			c.ix.mu.RUnlock()
			c.errorPage(w, r, he)
			return
		}
		p := c.newPage(r, ct)
		name, err := fn(r, p)
		c.ix.mu.RUnlock()
		if err != nil {
			c.errorPage(w, r, asHTTPError(err))
			return
		}
		c.render(w, http.StatusOK, name, p)
	}
}

func (c *Console) newPage(r *http.Request, ct cut) *page {
	p := &page{Root: rootOf(r.URL.EscapedPath()), Cut: ct, Past: ct.past, AtSeq: ct.seq, Head: ct.head, ReadOnly: c.ro}
	if ct.at != 0 || ct.seq != 0 {
		p.AtTime = fmtTime(ct.at)
	}
	if ct.past {
		p.Keep = "?at_seq=" + strconv.FormatUint(ct.seq, 10)
	}
	now := *r.URL
	qs := now.Query()
	qs.Del("at_seq")
	qs.Del("at")
	now.RawQuery = qs.Encode()
	p.NowURL = "?" + now.RawQuery
	return p
}

// rootOf is the relative path from a page to the console's root, so that every link works
// under any prefix the application mounts the console at.
func rootOf(path string) string {
	n := strings.Count(strings.TrimPrefix(path, "/"), "/")
	if n == 0 {
		return "./"
	}
	return strings.Repeat("../", n)
}

func (c *Console) render(w http.ResponseWriter, code int, name string, p *page) {
	t := c.pages[name]
	if t == nil {
		http.Error(w, "internal error: no template "+name, http.StatusInternalServerError)
		return
	}
	var b strings.Builder
	if err := t.Execute(&b, p); err != nil {
		c.log.Error("console: rendering a page", "page", name, "err", err)
		http.Error(w, "internal error: the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, b.String())
}

func (c *Console) errorPage(w http.ResponseWriter, r *http.Request, e *httpError) {
	if e.code >= 500 {
		c.log.Error("console: request failed", "path", r.URL.Path, "err", e.msg)
	}
	p := &page{Title: http.StatusText(e.code), Root: rootOf(r.URL.EscapedPath()), ReadOnly: c.ro, Data: e}
	c.render(w, e.code, "error", p)
}

// api wraps a JSON handler.
func (c *Console) api(fn func(r *http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := c.ix.catchUp(r.Context()); err != nil {
			writeJSONError(w, asHTTPError(err))
			return
		}
		v, err := fn(r)
		if err != nil {
			writeJSONError(w, asHTTPError(err))
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
}

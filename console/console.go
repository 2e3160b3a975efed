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
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/worklog/worklog/internal/optionerr"
	"github.com/worklog/worklog/work"
)

// Options configures New. A nil *Options means all defaults: read-only, no Authorize, and
// answering only to localhost and the loopback addresses.
type Options struct {
	// Actions offers the actions: Cancel and Retry on a task's page and their POST routes
	// under /api. false (the default): the console is read-only, every POST is refused with
	// 403 and no action's button is shown. true requires Authorize.
	Actions bool
	// Authorize, when set, is called with every request before the console reads or changes
	// anything (every page, the API, the live tail, the assets, the actions); an error refuses
	// the request with 403 and the error's text (so it should say what is missing, and never a
	// secret). It is required when Actions is true: New refuses Actions without it (an
	// *OptionError naming Authorize). nil (the default): every request that passes the Host
	// check is served. A panic in it is a 500, as any panic of a request.
	Authorize func(r *http.Request) error
	// AllowedHosts are the names the console answers to, besides localhost and the loopback
	// addresses (127.0.0.0/8, ::1), which it always answers to on any port. A request whose
	// Host is none of them gets 421 Misdirected Request before anything is read or changed:
	// a page of another site, whose DNS name the attacker points at the console's address
	// (DNS rebinding), can neither read the console nor act through it. An application that
	// serves the console on a real name or a non-loopback address lists it here. Each entry
	// is a host name ("ops.example.com"), an IP address ("10.0.0.5", "2001:db8::1"), either
	// with ":port" to allow that port only ("ops.example.com:8443", "[2001:db8::1]:8080"), or
	// "*", which turns the check off: use it only when something in front of the console (a
	// reverse proxy) already refuses unknown Hosts. Names match without regard to case or a
	// final dot. nil (the default): loopback only.
	AllowedHosts []string
	Logger       *slog.Logger // nil: discarded
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

// OptionError is the error New returns for Options it refuses: it names the field
// (Options "console.Options", Field "Authorize", "AllowedHosts", "TraceURL") and matches
// ErrInvalidOptions. It is the type of work.OptionError.
type OptionError = optionerr.Error

// ErrInvalidOptions is matched (errors.Is) by every *OptionError; it is the value of
// work.ErrInvalidOptions.
var ErrInvalidOptions = optionerr.ErrInvalid

// Console is the handler New returns.
type Console struct {
	q         *work.Queue
	actions   bool                      // Options.Actions
	authorize func(*http.Request) error // Options.Authorize
	hosts     hostRule                  // Options.AllowedHosts
	traceURL  string                    // Options.TraceURL
	log       *slog.Logger
	ix        *index
	mux       *http.ServeMux
	pages     map[string]*template.Template
}

// New returns the console of q. It reads q's log (Queue.ReadLog) into its own index at once,
// and what is new at each request after that; q must keep a log (every queue of this module
// does). Options it refuses (Actions without Authorize, a malformed AllowedHosts entry or
// TraceURL) are an *OptionError naming the field, before anything is read.
func New(q *work.Queue, opts *Options) (http.Handler, error) {
	if q == nil {
		return nil, errors.New("console: nil queue")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	hosts, err := o.validate()
	if err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c := &Console{q: q, actions: o.Actions, authorize: o.Authorize, hosts: hosts, log: o.Logger, ix: newIndex(q), traceURL: o.TraceURL}
	if err := c.ix.catchUp(context.Background()); err != nil {
		return nil, fmt.Errorf("console: reading the queue's log: %w", err)
	}
	if err := c.parseTemplates(); err != nil {
		return nil, err
	}
	c.routes()
	return c, nil
}

// validate refuses the first field of o out of range, and compiles AllowedHosts.
func (o *Options) validate() (hostRule, error) {
	bad := func(field, msg string) error { return optionerr.New("console.Options", field, msg) }
	if o.Actions && o.Authorize == nil {
		return hostRule{}, bad("Authorize", "Actions is true but Authorize is nil: a console that can cancel and retry tasks must say who may (set Authorize, or leave Actions false for a read-only console)")
	}
	hosts, err := compileHosts(o.AllowedHosts)
	if err != nil {
		return hostRule{}, bad("AllowedHosts", err.Error())
	}
	if o.TraceURL != "" {
		u, err := url.Parse(strings.ReplaceAll(o.TraceURL, "{trace_id}", "0"))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || !strings.Contains(o.TraceURL, "{trace_id}") {
			return hostRule{}, bad("TraceURL", fmt.Sprintf("%q must be an http(s) URL holding {trace_id}", o.TraceURL))
		}
	}
	return hosts, nil
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
	m.HandleFunc("GET /tasks", c.page(c.tasksList))
	m.HandleFunc("GET /tasks/{id}", c.page(c.task))
	kindsPage := c.page(c.kinds)
	m.HandleFunc("GET /kinds", func(w http.ResponseWriter, r *http.Request) {
		c.ix.wantDue.Store(true) // the due counts by kind read the fold's due index
		kindsPage(w, r)
	})
	m.HandleFunc("GET /schedules", c.page(c.schedulesPage))
	m.HandleFunc("GET /log", c.page(c.logPage))
	m.HandleFunc("GET /stats", c.page(c.statsPage))
	m.HandleFunc("GET /verify", c.verify)
	m.HandleFunc("GET /api/tasks", c.api(c.apiTasks))
	m.HandleFunc("GET /api/tasks/{id}", c.api(c.apiTask))
	m.HandleFunc("GET /api/kinds", c.api(c.apiKinds))
	m.HandleFunc("POST /api/kinds/{kind}/pause", c.kindAction("pause"))
	m.HandleFunc("POST /api/kinds/{kind}/resume", c.kindAction("resume"))
	m.HandleFunc("POST /api/kinds/{kind}/policy", c.kindAction("policy"))
	m.HandleFunc("GET /api/schedules", c.api(c.apiSchedules))
	m.HandleFunc("POST /api/schedules/{session}/{name}/remove", c.removeSchedule)
	m.HandleFunc("POST /api/tasks/retry", c.bulk("retry"))
	m.HandleFunc("POST /api/tasks/cancel", c.bulk("cancel"))
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

// ServeHTTP sets the security headers of every answer; refuses, before anything is read, a
// Host the console does not answer to (421), a request Authorize refuses (403), and a POST
// when actions are off or from another origin (403); and turns a panic into a plain 500 page
// (logged, never shown with a stack).
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
	if !c.hosts.allows(r.Host) {
		c.log.Info("console: refused a request for a Host it does not answer to", "host", r.Host, "path", r.URL.Path)
		c.refuse(w, r, &httpError{code: http.StatusMisdirectedRequest, msg: fmt.Sprintf(
			"This console does not answer to the host %q. It answers only to the names it is served at "+
				"(localhost and the loopback addresses, and those its application lists in console.Options.AllowedHosts; "+
				"replay serve: --allow-host), so that a page of another site cannot reach it through a DNS name of its own (DNS rebinding).", r.Host)})
		return
	}
	if c.authorize != nil {
		if err := c.authorize(r); err != nil {
			c.refuse(w, r, &httpError{code: http.StatusForbidden, msg: "not authorized: " + err.Error()})
			return
		}
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if !c.actions {
			writeJSONError(w, &httpError{code: http.StatusForbidden, msg: "this console is read-only: actions are disabled (console.Options.Actions is false)"})
			return
		}
		if !sameOrigin(r) {
			writeJSONError(w, &httpError{code: http.StatusForbidden, msg: "cross-origin request refused: the console accepts actions only from its own pages"})
			return
		}
		if qs := r.URL.Query(); qs.Get("at_seq") != "" || qs.Get("at") != "" {
			writeJSONError(w, &httpError{code: http.StatusConflict, msg: "at_seq: actions act on the queue as it is now, not on a past view; leave at_seq and at out"})
			return
		}
	}
	c.mux.ServeHTTP(w, r)
}

// refuse answers a request refused before the router: JSON under /api and for the live tail,
// the error page elsewhere.
func (c *Console) refuse(w http.ResponseWriter, r *http.Request, e *httpError) {
	if p := r.URL.Path; strings.HasPrefix(p, "/api/") || p == "/log/stream" || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
		writeJSONError(w, e)
		return
	}
	c.errorPage(w, r, e)
}

// hostRule is Options.AllowedHosts compiled: the Hosts a request may name.
type hostRule struct {
	any   bool            // "*"
	names map[string]bool // "name" (any port) and "name:port", normalized by hostKey
}

// compileHosts checks and compiles the entries of Options.AllowedHosts.
func compileHosts(list []string) (hostRule, error) {
	h := hostRule{names: map[string]bool{}}
	for i, e := range list {
		if e == "*" {
			h.any = true
			continue
		}
		host, port, err := splitHost(e)
		if err == nil && port != "" {
			n, perr := strconv.ParseUint(port, 10, 16)
			if perr != nil || n == 0 {
				err = fmt.Errorf("port %q is not a port number (1 to 65535)", port)
			}
		}
		if err == nil && !validHost(host) {
			err = errors.New("not a host name or an IP address")
		}
		if err != nil {
			return hostRule{}, fmt.Errorf("entry %d, %q: %v; write a host name or IP address, optionally with :port, or \"*\" for any Host", i, e, err)
		}
		h.names[hostKey(host, port)] = true
	}
	return h, nil
}

// allows reports whether a request's Host is one the console answers to.
func (h hostRule) allows(hostHeader string) bool {
	host, port, err := splitHost(hostHeader)
	if err != nil || host == "" {
		return false
	}
	if isLoopback(host) || h.any {
		return true
	}
	return h.names[hostKey(host, "")] || (port != "" && h.names[hostKey(host, port)])
}

// splitHost splits "name", "name:port", "1.2.3.4:80", "::1", "[::1]" and "[::1]:80" into the
// host (without brackets, lower case, no final dot) and the port ("" when none).
func splitHost(s string) (host, port string, err error) {
	switch {
	case strings.HasPrefix(s, "["):
		if strings.HasSuffix(s, "]") {
			host = s[1 : len(s)-1]
		} else if host, port, err = net.SplitHostPort(s); err != nil {
			return "", "", err
		}
		if net.ParseIP(host) == nil || !strings.Contains(host, ":") {
			return "", "", errors.New("brackets hold an IPv6 address")
		}
	case strings.Count(s, ":") > 1: // a bare IPv6 address
		host = s
	case strings.Contains(s, ":"):
		if host, port, err = net.SplitHostPort(s); err != nil {
			return "", "", err
		}
		if port == "" {
			return "", "", errors.New("empty port")
		}
	default:
		host = s
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	return host, port, nil
}

func hostKey(host, port string) string {
	if ip := net.ParseIP(host); ip != nil {
		host = ip.String() // one spelling of each address
	}
	if port == "" {
		return host
	}
	return host + "\x00" + port
}

// validHost is a DNS name (letters, digits, '-', '_' in dot-separated labels of 1 to 63
// bytes, 253 in all) or an IP address.
func validHost(h string) bool {
	if net.ParseIP(h) != nil {
		return true
	}
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return false
			}
		}
	}
	return true
}

// isLoopback: localhost, 127.0.0.0/8, ::1 (and ::ffff:127.0.0.0/104). A browser sends
// these only for a page it loaded from this very machine: no DNS name of an attacker's is
// one of them.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
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
	ReadOnly bool   // actions are off: no action is offered
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
	p := &page{Root: rootOf(r.URL.EscapedPath()), Cut: ct, Past: ct.past, AtSeq: ct.seq, Head: ct.head, ReadOnly: !c.actions}
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
	p := &page{Title: http.StatusText(e.code), Root: rootOf(r.URL.EscapedPath()), ReadOnly: !c.actions, Data: e}
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

package console_test

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/worklog/worklog/console"
	"github.com/worklog/worklog/work"
)

// The console with its actions on, behind HTTP basic auth, served at ops.example.com under
// /ops/console/. Authorize decides; the wrapper only makes a browser ask for the password (a
// browser asks after a 401 with WWW-Authenticate, and the console answers a refusal with 403).
func Example_actionsWithAuth() {
	q := work.NewInMemory() // the application's queue: work.Open, postgres.Open
	defer q.Close()
	password := []byte("correct horse") // from the application's secrets, never a literal

	h, err := console.New(q, &console.Options{
		Actions: true,
		Authorize: func(r *http.Request) error {
			user, pass, ok := r.BasicAuth()
			if !ok || user != "ops" || subtle.ConstantTimeCompare([]byte(pass), password) != 1 {
				return errors.New("sign in as ops")
			}
			return nil
		},
		AllowedHosts: []string{"ops.example.com"}, // the name it is served at
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/console/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, _, ok := r.BasicAuth(); !ok {
			w.Header().Set("WWW-Authenticate", `Basic realm="worklog console", charset="UTF-8"`)
			http.Error(w, "sign in", http.StatusUnauthorized)
			return
		}
		http.StripPrefix("/ops/console", h).ServeHTTP(w, r)
	}))

	// What the mux answers:
	try := func(what, host, user, pass string) {
		r := httptest.NewRequest(http.MethodGet, "/ops/console/", nil)
		r.Host = host
		if user != "" {
			r.SetBasicAuth(user, pass)
		}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		fmt.Println(what+":", w.Code)
	}
	try("no password", "ops.example.com", "", "")
	try("a wrong one", "ops.example.com", "ops", "guess")
	try("ops", "ops.example.com", "ops", "correct horse")
	try("ops, through another site's DNS name", "evil.example", "ops", "correct horse")
	// Output:
	// no password: 401
	// a wrong one: 403
	// ops: 200
	// ops, through another site's DNS name: 421
}

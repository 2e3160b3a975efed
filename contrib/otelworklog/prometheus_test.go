package otelworklog_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/worklog/worklog/contrib/otelworklog"
	"github.com/worklog/worklog/runner"
	"github.com/worklog/worklog/work"
)

// TestPrometheusScrape: the metrics, exported through OpenTelemetry's Prometheus exporter,
// scrape under the names the dashboard (grafana.json) queries.
func TestPrometheusScrape(t *testing.T) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	defer mp.Shutdown(context.Background())
	inst, err := otelworklog.New(&otelworklog.Options{MeterProvider: mp, Slots: 2})
	if err != nil {
		t.Fatal(err)
	}
	q := work.NewInMemory()
	defer q.Close()
	unregister, err := inst.ObserveQueue(q)
	if err != nil {
		t.Fatal(err)
	}
	defer unregister()
	if _, err := inst.Submit(context.Background(), q.Session("s"), work.TaskRequest{Kind: "report"}); err != nil {
		t.Fatal(err)
	}
	if _, err := inst.Submit(context.Background(), q.Session("s"), work.TaskRequest{Kind: "stuck", RunAt: time.Now().Add(-time.Minute)}); err != nil {
		t.Fatal(err)
	}
	s := &setup{inst: inst}
	runTasks(t, q, s, 1, map[string]runner.Handler{"report": func(context.Context, work.Task) (json.RawMessage, error) {
		return json.RawMessage(`1`), nil
	}})

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	text := string(body)
	for _, want := range []string{
		"worklog_queue_oldest_due_age_seconds{",
		"worklog_queue_due{",
		`worklog_tasks{messaging_destination_name="report",`,
		"messaging_process_duration_seconds_bucket{",
		"messaging_client_consumed_messages_total{",
		"messaging_client_sent_messages_total{",
		"worklog_runner_slots_available{",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("scrape:\n%s", text)
	}
}

// TestGrafanaDashboardQueriesExist: every metric the dashboard queries is one this package
// exports (under its Prometheus name), so a renamed instrument cannot leave a dead panel.
func TestGrafanaDashboardQueriesExist(t *testing.T) {
	b, err := os.ReadFile("grafana.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{
		"worklog_tasks": true, "worklog_queue_oldest_due_age_seconds": true, "worklog_queue_due": true,
		"messaging_client_consumed_messages_total": true, "messaging_client_sent_messages_total": true,
		"messaging_process_duration_seconds_bucket": true, "worklog_runner_slots_used": true,
		"worklog_runner_slots_available": true, "worklog_runner_lease_lost_total": true,
	}
	name := regexp.MustCompile(`\b((?:worklog|messaging)_[a-z_]+)\{`) // a metric, not a label
	n := 0
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, sub := range name.FindAllStringSubmatch(tg.Expr, -1) {
				m := sub[1]
				n++
				if !exported[m] {
					t.Errorf("panel %q queries %s, which is not exported", p.Title, m)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("the dashboard queries no metric")
	}
}

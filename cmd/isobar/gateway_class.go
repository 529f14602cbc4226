package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/isobar-mesh/isobar/gateway"
	"github.com/isobar-mesh/isobar/gateway/flowcontrol"
	"github.com/isobar-mesh/isobar/residency"
)

// classFlags are the request-class, residency and flow-control flags of
// `isobar gateway` and `isobar picker` (docs/design.md §6.5–6.6).
type classFlags struct {
	trusted, objectives, residencyFile string
	queueLen, queueAge                 string
	queueNewest, queueObjective        string
	queueTotal, maxTenants             int
	noQueue, noYield                   bool
}

func (c *classFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&c.trusted, "trusted-sources", "", `peers (comma-separated CIDR prefixes or addresses, e.g. "10.0.0.0/8,127.0.0.1") whose x-isobar-criticality "critical" is believed; from any other peer it is lowered to standard (a request proven forwarded by another isobar gateway keeps its class). Default none: name the proxies that authenticate clients and set the header`)
	f.StringVar(&c.objectives, "objective-priority", "", `Inference Extension objectives and their priorities, "name=N,..." (x-gateway-inference-objective, read when x-isobar-criticality is absent): priority < 0 sheddable, 0 standard, > 0 critical`)
	f.StringVar(&c.residencyFile, "residency", "", `residency config (JSON: {"sets": {name: [regions]}, "tenants": {tenant: set}, "models": {model: set}}): pinned requests are never sent to an endpoint outside their set's regions, whatever the routes say`)
	f.IntVar(&c.maxTenants, "max-tenants", 0, "distinct tenants (x-isobar-tenant) tracked for fairness; later ones share one bucket (default 64)")
	f.StringVar(&c.queueLen, "queue-length", "", `flow control: requests that may wait per criticality while every endpoint is full, "critical=N,standard=N,sheddable=N" (default critical=128,standard=256,sheddable=256)`)
	f.StringVar(&c.queueAge, "queue-max-age", "", `flow control: longest wait per criticality before a 429, "critical=D,standard=D,sheddable=D"; for the --queue-objective classes the wait plus the measured time to first token (default critical=10s, a liveness bound; standard=1.5s,sheddable=1.5s, the TTFT objective)`)
	f.StringVar(&c.queueNewest, "queue-newest-first", "", `flow control: the criticalities whose waiters are served newest first within a tenant, so that under a sustained shortfall the served ones still meet the objective ("standard,sheddable", "none"; default standard,sheddable)`)
	f.StringVar(&c.queueObjective, "queue-objective", "", `flow control: the criticalities whose --queue-max-age is a TTFT objective: a waiter leaves once its wait plus the measured time to first token reaches it ("standard,sheddable", "none"; default standard,sheddable)`)
	f.BoolVar(&c.noYield, "queue-no-yield", false, "flow control: a less critical request never waits while a slot is free (by default it waits, for the max age of the more critical class, after a more critical request went unserved)")
	f.IntVar(&c.queueTotal, "queue-total", 0, "flow control: requests that may wait in all; when reached a more critical arrival evicts the oldest less critical one (default 384)")
	f.BoolVar(&c.noQueue, "no-queue", false, "no flow control: a request that finds every endpoint full is answered 429 at once")
}

// apply checks the flags and sets them on cfg; an error is a usage error.
func (c *classFlags) apply(cfg *gateway.Config) error {
	var err error
	if cfg.TrustedSources, err = gateway.ParseTrustedSources(c.trusted); err != nil {
		return fmt.Errorf("--trusted-sources: %w", err)
	}
	if cfg.ObjectivePriority, err = gateway.ParseObjectivePriority(c.objectives); err != nil {
		return fmt.Errorf("--objective-priority: %w", err)
	}
	if c.residencyFile != "" {
		if cfg.Residency, err = residency.Load(c.residencyFile); err != nil {
			return fmt.Errorf("--residency: %w", err)
		}
	}
	cfg.MaxTenants, cfg.NoQueue = c.maxTenants, c.noQueue
	q := flowcontrol.DefaultConfig()
	if err := gateway.ParseQueueLengths(c.queueLen, &q.MaxLen); err != nil {
		return fmt.Errorf("--queue-length: %w", err)
	}
	if err := gateway.ParseQueueAges(c.queueAge, &q.MaxAge); err != nil {
		return fmt.Errorf("--queue-max-age: %w", err)
	}
	if err := gateway.ParseQueueClasses(c.queueNewest, &q.NewestFirst); err != nil {
		return fmt.Errorf("--queue-newest-first: %w", err)
	}
	if err := gateway.ParseQueueClasses(c.queueObjective, &q.Objective); err != nil {
		return fmt.Errorf("--queue-objective: %w", err)
	}
	if c.queueTotal != 0 {
		q.MaxTotal = c.queueTotal
	}
	q.Yield = !c.noYield
	if err := q.Validate(); err != nil {
		return fmt.Errorf("--queue-length, --queue-max-age, --queue-total: %w", err)
	}
	cfg.Queue = q
	return nil
}

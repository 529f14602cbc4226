package global

import (
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

// The hub replays its latest plan to a new subscriber unchanged (issue
// time and validity as planned, so the region computes what is left of its
// life), and not at all once it has expired: a region reconnecting while
// the leader cannot publish a new plan gets no fresh lifetime.
func TestHubReplayKeepsIssueTime(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	h := newHub(clock.Now)
	issued := clock.Now()
	h.publish(&isobarpb.RoutingPlan{
		LeaderId: "g1", Epoch: 3, Sequence: 7,
		IssuedAt: timestamppb.New(issued), ValidUntil: timestamppb.New(issued.Add(30 * time.Second)),
		Plans: []*isobarpb.ModelPlan{{Model: "m", IngressRegion: "a", Routes: []*isobarpb.Route{{Destination: "a", Fraction: 1}}}},
	})

	clock.Advance(20 * time.Second)
	ch, cancel := h.subscribe("a")
	select {
	case p := <-ch:
		if !p.GetIssuedAt().AsTime().Equal(issued) || !p.GetValidUntil().AsTime().Equal(issued.Add(30*time.Second)) {
			t.Fatalf("replay issued %v valid until %v, want the plan's own %v and %v",
				p.GetIssuedAt().AsTime(), p.GetValidUntil().AsTime(), issued, issued.Add(30*time.Second))
		}
		if !p.GetSentAt().AsTime().Equal(clock.Now()) {
			t.Fatalf("replay stamped sent at %v, want now (%v): the region counts the life left from it", p.GetSentAt().AsTime(), clock.Now())
		}
	default:
		t.Fatal("an unexpired plan was not replayed to a new subscriber")
	}
	cancel()

	clock.Advance(5 * time.Minute)
	ch, cancel = h.subscribe("a")
	defer cancel()
	select {
	case p := <-ch:
		t.Fatalf("an expired plan was replayed: epoch %d valid until %v, now %v", p.GetEpoch(), p.GetValidUntil().AsTime(), clock.Now())
	default:
	}
}

package comm

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recipeFacts is a rank's facts: a few recipe keys and a data fingerprint.
func recipeFacts(hidden int, data string) []Fact {
	return []Fact{{"model.layers", "2"}, {"model.hidden", fmt.Sprint(hidden)}, {"train.lr", "0.01"}, {"data", data}}
}

// Ranks that hold the same facts agree; ranks that do not all fail alike, the
// error naming each differing key and which ranks hold which value, in process
// and over TCP.
func TestAgreeNamesTheDifferingKeys(t *testing.T) {
	for _, transport := range []string{"inproc", "tcp"} {
		t.Run(transport, func(t *testing.T) {
			run := func(facts func(r int) []Fact) []error {
				if transport == "tcp" {
					return tcpRanks(t, 4, 5*time.Second, func(c *TCP) error { return Agree(c, facts(c.Rank())) })
				}
				w := NewWorld(4, 5*time.Second)
				return concurrently(4, func(r int) error { return Agree(w.Rank(r), facts(r)) })
			}
			for r, err := range run(func(int) []Fact { return recipeFacts(64, "sha256:aa") }) {
				assert.NoError(t, err, "rank %d", r)
			}
			errs := run(func(r int) []Fact {
				f := recipeFacts(64, "sha256:aa")
				switch r {
				case 1:
					f = recipeFacts(128, "sha256:aa")
				case 3:
					f = append(recipeFacts(128, "sha256:bb"), Fact{"run.name", "x"})
				}
				return f
			})
			want := "the ranks do not run the same job: model.hidden: rank 0 has 64, ranks 1, 3 have 128; data: rank 0 has sha256:aa, rank 3 has sha256:bb; run.name: rank 0 has none, rank 3 has x"
			for r, err := range errs {
				require.ErrorIs(t, err, ErrDisagree, "rank %d", r)
				assert.EqualError(t, err, want, "rank %d", r)
			}
		})
	}
}

// A rank announcing more than MaxFactBytes of facts is refused on every rank
// before the gather that would carry them.
func TestAgreeBoundsTheFacts(t *testing.T) {
	w := NewWorld(2, 5*time.Second)
	errs := concurrently(2, func(r int) error {
		f := recipeFacts(64, "sha256:aa")
		if r == 1 {
			f = append(f, Fact{"run.name", strings.Repeat("x", MaxFactBytes)})
		}
		return Agree(w.Rank(r), f)
	})
	for r, err := range errs {
		assert.ErrorIs(t, err, ErrMismatch, "rank %d", r)
		assert.ErrorContains(t, err, fmt.Sprintf("rank 1 announces %d bytes of facts, more than %d", MaxFactBytes+len(encodeFacts(recipeFacts(64, "sha256:aa")))+len("run.name")+4, MaxFactBytes), "rank %d", r)
	}
}

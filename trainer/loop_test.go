package trainer

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEvalPolicy: a run evaluates every interval steps and at its last step,
// on rank 0 alone unless evaluation needs every rank; the end of the run
// evaluates together once more only where the last step did not, there is a
// validation split and evaluation is collective.
func TestEvalPolicy(t *testing.T) {
	due := func(e evalPolicy) []int {
		var out []int
		for done := 1; done <= e.steps; done++ {
			if e.due(done) {
				out = append(out, done)
			}
		}
		return out
	}
	assert.Equal(t, []int{4, 8, 10}, due(evalPolicy{interval: 4, steps: 10, lead: true}))
	assert.Equal(t, []int{4, 8, 10}, due(evalPolicy{interval: 4, steps: 10, collective: true}), "a collective evaluation runs on every rank")
	assert.Empty(t, due(evalPolicy{interval: 4, steps: 10}), "rank 1 of a run that evaluates alone")
	assert.Empty(t, due(evalPolicy{interval: 0, steps: 10, lead: true}), "eval_interval 0: never")
	assert.Equal(t, []int{5}, due(evalPolicy{interval: 5, steps: 5, lead: true}), "the last step once")

	e := evalPolicy{collective: true, hasVal: true}
	assert.True(t, e.finalTogether(false))
	assert.False(t, e.finalTogether(true), "the last step evaluated")
	assert.False(t, evalPolicy{collective: true}.finalTogether(false), "no validation split")
	assert.False(t, evalPolicy{hasVal: true, lead: true}.finalTogether(false), "rank 0 evaluates alone")
}

// fakeDrain is a statsDrain over canned steps, recording what it does.
type fakeDrain struct {
	recorded, skipped []int
	stopped           *[2]Metrics // the step that stopped the run and the last good one
}

func newFakeDrain(steps []Metrics, skip, lead bool) (*statsDrain, *fakeDrain) {
	f := &fakeDrain{}
	d := &statsDrain{skipNonfinite: skip, lead: lead, interval: 10, steps: 100,
		read:    func() ([]Metrics, int, error) { return steps, 7, nil },
		record:  func(m Metrics) error { f.recorded = append(f.recorded, m.Step); return nil },
		stop:    func(m, good Metrics) error { f.stopped = &[2]Metrics{m, good}; return ErrNonFinite },
		skipped: func(m Metrics) { f.skipped = append(f.skipped, m.Step) }}
	return d, f
}

// TestStatsDrain: the drain hands every pending step to rank 0's record in
// order, the validation loss to the last of them, and the optimizer steps
// applied to the loop; a non-finite (skipped) step ends the run, naming the
// last finite step, unless skip_nonfinite goes past it, which it then
// reports; the loop learns whether the last step read was skipped.
func TestStatsDrain(t *testing.T) {
	steps := []Metrics{{Step: 1, Loss: 3}, {Step: 2, Loss: 2.5}, {Step: 3, Skipped: true}, {Step: 4, Loss: 2}}
	val := 2.25

	d, f := newFakeDrain(steps, false, true)
	err := d.drain(&val)
	require.ErrorIs(t, err, ErrNonFinite)
	assert.Equal(t, []int{1, 2}, f.recorded, "the steps before the non-finite one are recorded")
	require.NotNil(t, f.stopped)
	assert.Equal(t, 3, f.stopped[0].Step)
	assert.Equal(t, 2, f.stopped[1].Step, "the last good step")

	d, f = newFakeDrain(steps, true, true)
	require.NoError(t, d.drain(&val))
	assert.Equal(t, []int{1, 2, 3, 4}, f.recorded)
	assert.Equal(t, []int{3}, f.skipped)
	assert.False(t, d.lastSkipped, "a finite step after the skipped one")
	assert.Equal(t, 4, d.good.Step)
	assert.Equal(t, 4, d.last.Step)
	require.NotNil(t, d.last.ValLoss)
	assert.Equal(t, val, *d.last.ValLoss, "the validation loss goes with the last step")
	assert.Equal(t, 7, d.optSteps)

	d, f = newFakeDrain([]Metrics{{Step: 5, Loss: 1}, {Step: 6, Skipped: true}}, true, false)
	require.NoError(t, d.drain(nil))
	assert.Empty(t, f.recorded, "ranks other than 0 record nothing")
	assert.True(t, d.lastSkipped)
	assert.Equal(t, 5, d.good.Step)

	d.read = func() ([]Metrics, int, error) { return nil, 0, errors.New("read-back failed") }
	assert.EqualError(t, d.drain(nil), "read-back failed")

	// When the statistics come back.
	d = &statsDrain{interval: 10, steps: 25}
	for _, c := range []struct {
		done                    int
		full, evaluated, saving bool
		want                    bool
	}{
		{3, false, false, false, false}, {10, false, false, false, true}, {25, false, false, false, true},
		{3, true, false, false, true}, {3, false, true, false, true}, {3, false, false, true, true},
	} {
		assert.Equal(t, c.want, d.due(c.done, c.full, c.evaluated, c.saving), "%+v", c)
	}
}

// TestCheckpointerDue: checkpoints are taken every interval steps, and never
// without a checkpointer or an interval.
func TestCheckpointerDue(t *testing.T) {
	var none *checkpointer
	assert.False(t, none.due(4))
	assert.False(t, (&checkpointer{}).due(4), "interval 0: at the end only")
	c := &checkpointer{interval: 3}
	for done, want := range map[int]bool{1: false, 3: true, 4: false, 6: true} {
		assert.Equal(t, want, c.due(done), "step %d", done)
	}
}

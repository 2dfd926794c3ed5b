package trainer

import (
	"errors"
	"fmt"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel/comm"
	"github.com/shardline/shardline/trainer/data"
)

// notAgreed are the recipe keys the ranks of a job may hold differently: where
// a rank finds its text (data.path: the tokens it reads are compared instead)
// and where rank 0 writes the run directory (run.output_dir: the other ranks
// write none).
var notAgreed = map[string]bool{"data.path": true, "run.output_dir": true}

// jobFacts is what every rank of a job must hold alike before the first step:
// every other key of the resolved recipe, the fingerprint of the tokens it
// trains and validates on, this build's version, and where the run starts from.
func jobFacts(res *config.Resolved, ds *data.Dataset, opts Options) []comm.Fact {
	var facts []comm.Fact
	for _, f := range config.RecipeSchema().Fields {
		if !notAgreed[f.Key] {
			facts = append(facts, comm.Fact{Key: f.Key, Value: config.FormatValue(f.Get(&res.Recipe))})
		}
	}
	resume, initFrom := "none", "none"
	if m := opts.resume; m != nil {
		resume = fmt.Sprintf("step %d of a run with recipe %s", m.Step, m.RecipeFingerprint)
	}
	if opts.InitFrom != "" {
		initFrom = opts.InitFrom
	}
	return append(facts,
		comm.Fact{Key: "data (the tokens of data.path)", Value: ds.Fingerprint()},
		comm.Fact{Key: "shardline version", Value: opts.Version},
		comm.Fact{Key: "--resume", Value: resume},
		comm.Fact{Key: "--init-from", Value: initFrom})
}

// agree proves, before anything depends on it, that every rank of the job runs
// the same resolved recipe on the same data (comm.Agree); a difference fails
// every rank with the differing keys and each rank's value.
func agree(p *Process, res *config.Resolved, ds *data.Dataset, opts Options) error {
	err := comm.Agree(p.Comm, jobFacts(res, ds, opts))
	if errors.Is(err, comm.ErrDisagree) {
		return fmt.Errorf("%w; give every rank the same recipe, flags, SHARDLINE_* environment and data (shardline launch passes one command line to every rank)", err)
	}
	if err != nil {
		return fmt.Errorf("comparing the ranks' recipes and data: %w", err)
	}
	return nil
}

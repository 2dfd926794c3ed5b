package trainer

import (
	"fmt"
	"math"
	"time"

	"github.com/shardline/shardline/config"
	"github.com/shardline/shardline/parallel"
	"github.com/shardline/shardline/tensor"
)

// HostSpeed reruns a calibration's own in-step passes on be (the forward and
// backward passes of its small models that `shardline calibrate` timed, in bf16
// when bf16, else fp32; each model's median round, less the passes its fit
// left out as disturbed; each for at least minTime) and returns how long they take
// now over how long they took when c was measured: the geometric mean over the
// passes, and how many passes it reran. Above 1 the host is slower now than when
// it was calibrated, so a step the plan timed from c takes that much longer for
// reasons that are not the plan's. A calibration without such passes (measured
// before they existed, or for a GPU) is an error.
func HostSpeed(be tensor.Backend, c *parallel.Calibration, bf16 bool, minTime time.Duration) (float64, int, error) {
	return hostSpeed(c, bf16, func(m config.Model, batch int) (float64, error) {
		pt, err := stepTime(be, m, batch, minTime, bf16)
		return pt.whole, err
	})
}

// hostSpeed is HostSpeed with the timing of one pass given (tests).
func hostSpeed(c *parallel.Calibration, bf16 bool, measure func(m config.Model, batch int) (float64, error)) (float64, int, error) {
	var logSum float64
	n := 0
	for _, smp := range c.InStepModels() { // a model's median round
		if smp.BF16 != bf16 || smp.Measured <= 0 || smp.Disturbed {
			continue
		}
		for _, cm := range calibrationModels {
			if cm.name != smp.Model {
				continue
			}
			now, err := measure(cm.model, cm.batch)
			if err != nil {
				return 0, 0, fmt.Errorf("host speed: %s: %w", cm.name, err)
			}
			logSum += math.Log(now / smp.Measured)
			n++
		}
	}
	if n == 0 {
		dtype := "fp32"
		if bf16 {
			dtype = "bf16"
		}
		return 0, 0, fmt.Errorf("host speed: the calibration (%s, %s) has no %s in-step passes of calibrate's models to rerun; recalibrate with shardline calibrate", c.Host, c.Date, dtype)
	}
	return math.Exp(logSum / float64(n)), n, nil
}

package promstat

import (
	"io"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

func writeText(w io.Writer, f *dto.MetricFamily) error {
	_, err := expfmt.MetricFamilyToText(w, f)
	return err
}

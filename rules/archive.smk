# One archive per study (dlscale.store.study_archive): the study and hardware configurations, the
# profiles, the environment lists, every cell's metrics (all kept measurements) and logs, the
# tables, figures and report, with a checksum manifest. Not part of `all`; ask for it by name:
#   snakemake --profile profiles/local study_archive
# It depends on the study's final targets, so it completes the study first. Check an archive
# with `python -m dlscale.store.study_archive verify results/<study>/archive/<study>.tar.gz`.
from dlscale.store.study_archive import create_logged as create_study_archive


rule study_archive:
    input:
        final_targets(),
    output:
        archive=OUT["archive"],
        checksum=OUT["archive_checksum"],
    log:
        OUT["archive_log"],
    params:
        # the run's --configfile files and --config entries: the archive resolves the study's
        # configuration from them as this workflow did (and holds every file they name)
        configfiles=STUDY_FILES,  # rules/common.smk
        config=dict(workflow.config_settings.config),
    run:
        create_study_archive(
            RESULTS,
            output.archive,
            log[0],
            root=workflow.basedir,
            configfiles=params.configfiles,
            config=params.config,
        )

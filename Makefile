# raidfs: build and install.
#
#   make install [PREFIX=/usr/local] [DESTDIR=/tmp/stage]
#   make uninstall [PREFIX=/usr/local] [DESTDIR=/tmp/stage]
#
# Installs the raidfs binary in $(PREFIX)/bin, the mount(8) helper as
# $(SBINDIR)/mount.raidfs and $(SBINDIR)/mount.fuse.raidfs (mount(8) looks
# for helpers in /sbin only: the first for type raidfs, the second for type
# fuse.raidfs, which live mounts have, so remounts reach it), the docs in
# $(DOCDIR), the log rotation of /var/log/raidfs in $(LOGROTATEDIR).
# NO_BUILD=1 with RAIDFS_BUILT=PATH installs an already
# built binary instead of running cargo (the tests do this).

PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
SBINDIR ?= /sbin
DOCDIR ?= $(PREFIX)/share/doc/raidfs
LOGROTATEDIR ?= /etc/logrotate.d
DESTDIR ?=
CARGO ?= cargo
INSTALL ?= install
TARGET_DIR ?= $(if $(CARGO_TARGET_DIR),$(CARGO_TARGET_DIR),target)
RAIDFS_BUILT ?= $(TARGET_DIR)/release/raidfs
HELPERS = mount.raidfs mount.fuse.raidfs
DOCS = docs/cli.md docs/fstab.md docs/systemd.md docs/nfs.md

.PHONY: all build install uninstall

all: build

build:
	$(CARGO) build --release --locked

install: $(if $(NO_BUILD),,build)
	$(INSTALL) -d "$(DESTDIR)$(BINDIR)" "$(DESTDIR)$(SBINDIR)" "$(DESTDIR)$(DOCDIR)"
	$(INSTALL) -m 0755 "$(RAIDFS_BUILT)" "$(DESTDIR)$(BINDIR)/raidfs"
	for helper in $(HELPERS); do \
		sed 's|@RAIDFS@|$(BINDIR)/raidfs|g' mount-helpers/mount.raidfs > "$(DESTDIR)$(SBINDIR)/$$helper.tmp" && \
		chmod 0755 "$(DESTDIR)$(SBINDIR)/$$helper.tmp" && \
		mv -f "$(DESTDIR)$(SBINDIR)/$$helper.tmp" "$(DESTDIR)$(SBINDIR)/$$helper" || exit 1; \
	done
	for doc in $(DOCS); do \
		if [ -f "$$doc" ]; then $(INSTALL) -m 0644 "$$doc" "$(DESTDIR)$(DOCDIR)/"; fi; \
	done
	$(INSTALL) -d "$(DESTDIR)$(LOGROTATEDIR)"
	$(INSTALL) -m 0644 dist/logrotate.raidfs "$(DESTDIR)$(LOGROTATEDIR)/raidfs"

uninstall:
	rm -f "$(DESTDIR)$(BINDIR)/raidfs"
	for helper in $(HELPERS); do rm -f "$(DESTDIR)$(SBINDIR)/$$helper"; done
	for doc in $(DOCS); do rm -f "$(DESTDIR)$(DOCDIR)/$$(basename $$doc)"; done
	-rmdir "$(DESTDIR)$(DOCDIR)" 2>/dev/null
	rm -f "$(DESTDIR)$(LOGROTATEDIR)/raidfs"

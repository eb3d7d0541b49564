#include "interpose/verbs/table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

using shunt::PtrTable;

TEST(PtrTable, InsertFindErase) {
  auto t = std::make_unique<PtrTable<int, 6>>();
  int a = 1, b = 2;
  EXPECT_EQ(t->find(100), nullptr);
  EXPECT_TRUE(t->insert(100, &a));
  EXPECT_TRUE(t->insert(200, &b));
  EXPECT_EQ(t->find(100), &a);
  EXPECT_EQ(t->find(200), &b);
  t->erase(100);
  EXPECT_EQ(t->find(100), nullptr);
  EXPECT_EQ(t->find(200), &b);
}

TEST(PtrTable, RefusesOnlyWhenLiveEntriesFillIt) {
  auto t = std::make_unique<PtrTable<int, 6>>();  // 64 slots, 56 usable
  std::vector<int> v(64);
  int inserted = 0;
  for (int i = 0; i < 64; i++)
    if (t->insert(1000 + i * 64, &v[i])) inserted++;
  EXPECT_EQ(inserted, 56);
  for (int i = 0; i < inserted; i += 2) t->erase(1000 + i * 64);
  for (int i = 1; i < inserted; i += 2) EXPECT_EQ(t->find(1000 + i * 64), &v[i]) << i;
  for (int i = 0; i < inserted; i += 2) EXPECT_EQ(t->find(1000 + i * 64), nullptr) << i;
  EXPECT_TRUE(t->insert(1000, &v[63]));
  EXPECT_EQ(t->find(1000), &v[63]);
}

TEST(PtrTable, EndlessCreateDestroyCyclesWithNewKeysNeverFill) {
  auto t = std::make_unique<PtrTable<int, 8>>();
  int x = 0, keep = 1;
  ASSERT_TRUE(t->insert(7, &keep));
  for (uint64_t k = 100; k < 100 + 100000; k++) {  // QPNs keep growing
    ASSERT_TRUE(t->insert(k, &x)) << k;
    ASSERT_EQ(t->find(k), &x);
    t->erase(k);
  }
  EXPECT_EQ(t->find(7), &keep);
}

TEST(PtrTable, ReadersDuringCompactionNeverSeeAWrongValue) {
  auto t = std::make_unique<PtrTable<int, 8>>();
  std::vector<int> stable(32);
  for (int i = 0; i < 32; i++) ASSERT_TRUE(t->insert(5000 + i, &stable[i]));
  std::atomic<bool> stop{false};
  std::atomic<long> wrong{0};
  std::thread reader([&] {
    while (!stop.load()) {
      for (int i = 0; i < 32; i++)
        if (t->find(5000 + i) != &stable[i]) wrong++;
    }
  });
  int x = 0;
  for (uint64_t k = 100000; k < 120000; k++) {  // never a stable key
    t->insert(k, &x);
    t->erase(k);
  }
  stop = true;
  reader.join();
  EXPECT_EQ(wrong.load(), 0);
}
